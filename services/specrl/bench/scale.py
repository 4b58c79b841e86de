"""`specrl bench scale`: the orchestrator at cluster scale. The real RL loop (Orchestrator,
its generation, a real Redis) drives 16, 64 and 128 load-generator rollout endpoints
(specrl.bench.loadgen: the RolloutService gRPC API answering after a long-tailed latency)
and a load-generator trainer endpoint whose step takes a fixed time, with hundreds of
generation slots per replica, as a GB200 run has. Measured in the orchestrator's own
process: its threads and Redis connections, CPU seconds per step, the share of the step
that is the orchestrator's own work, peak memory; and that nothing was lost or trained
twice. The endpoints stand in for vLLM and the trainer here only.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from specrl.bench.loadgen import LoadEndpoints
from specrl.bench.report import machine
from specrl.config import OrchestratorConfig, SamplingConfig
from specrl.data.rewards import math_reward
from specrl.data.sources import Item
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.loop import Orchestrator
from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import RunStreams
from specrl.trainer.api import TrainerClient


class MadeUpPrompts:
    """Made-up prompts (the load endpoints do not read them), in place of a dataset."""

    def __init__(self) -> None:
        self.position = 0
        self.skipped: Counter[str] = Counter()

    def next(self) -> Item:
        self.position += 1
        return Item(f"Q{self.position}", "0", [1, 2, 3])

    def stop_token_ids(self) -> list[int]:
        return []


def _threads() -> int:
    """OS threads of this process (gRPC's own included)."""
    return len(os.listdir("/proc/self/task"))


class _Peaks:
    """Samples the process's threads and Redis's client count until stopped."""

    def __init__(self, streams: RunStreams) -> None:
        self.streams, self.threads, self.clients = streams, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.threads = max(self.threads, _threads() - 1)  # less this sampler
            self.clients = max(self.clients, len(self.streams.r.client_list()) - 1)  # less its own call


def _one(
    replicas: int, *, concurrency: int, steps: int, prompts: int, n: int, step_s: float, median_s: float
) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="specrl-scale-") as tmp,
        RedisServer(Path(tmp) / "redis") as redis_server,
        LoadEndpoints(replicas, median_s=median_s, trainer_step_s=step_s) as fleet,
        TrainerClient(fleet.trainer) as trainer,
    ):
        streams = RunStreams.connect(redis_server.url, f"scale-{replicas}")
        loop = Orchestrator(
            OrchestratorConfig(steps=steps, max_lag=1, concurrency=concurrency, checkpoint_every=0),
            sampling=SamplingConfig(n=n, max_tokens=8),
            seed=0,
            prompts_per_step=prompts,
            streams=streams,
            trainer=trainer,
            replicas=list(fleet.addresses),
            source=MadeUpPrompts(),  # type: ignore[arg-type]
            reward_fn=math_reward,
            metrics=OrchestratorMetrics(CollectorRegistry()),
        )
        cpu0 = time.process_time()
        with _Peaks(streams) as peaks:
            records = loop.run()
        cpu = time.process_time() - cpu0
    counted = records[1:]  # the first step fills the pipeline
    wall = sum(r["time"]["step"] for r in counted)
    own = sum(r["time"]["other"] + r["time"]["data"] for r in counted)
    return {
        "replicas": replicas,
        "concurrency": concurrency,
        "slots": replicas * concurrency,
        "groups_per_s": round(sum(r["groups"] for r in counted) / wall, 2),
        "orchestrator_threads": peaks.threads,  # the process's, at their peak
        "redis_clients": peaks.clients,
        "orchestrator_cpu_s_per_step": round(cpu / len(records), 3),
        "overhead_share": round(own / wall, 4),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "step_s_mean": round(wall / len(counted), 3),
        "samples": sum(r["samples"] for r in records),
        "expected_samples": steps * prompts * n,
        "duplicate_samples": sum(r["duplicate_samples"] for r in records),
        "stale_samples": sum(r["stale_samples"] for r in records),
    }


def run_scale_bench(
    out: Path,
    *,
    replicas: list[int],
    concurrency: int,
    steps: int,
    prompts: int,
    n: int,
    step_s: float,
    median_s: float,
    console: Console,
) -> dict:
    settings = {"concurrency": concurrency, "steps": steps, "prompts_per_step": prompts, "n": n}
    settings |= {"trainer_step_s": step_s, "generation_median_s": median_s, "max_lag": 1}
    rows = []
    for count in replicas:
        console.print(f"[bold]{count} replicas[/bold] x {concurrency} slots: {steps} steps")
        rows.append(
            _one(
                count,
                concurrency=concurrency,
                steps=steps,
                prompts=prompts,
                n=n,
                step_s=step_s,
                median_s=median_s,
            )
        )
    command = f"specrl bench scale --out {out} --replicas {','.join(map(str, replicas))}"
    command += f" --concurrency {concurrency} --steps {steps} --prompts {prompts} --n {n}"
    command += f" --step-s {step_s:g} --median-s {median_s:g}"
    result = {
        "benchmark": "scale",
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": settings,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title="orchestrator at scale (load-generator endpoints)")
    for col in (
        "replicas",
        "slots",
        "groups/s",
        "threads",
        "Redis clients",
        "CPU s/step",
        "overhead",
        "RSS MB",
        "lost",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        lost = r["expected_samples"] - r["samples"]
        table.add_row(
            str(r["replicas"]), str(r["slots"]), f"{r['groups_per_s']:.1f}", str(r["orchestrator_threads"]),
            str(r["redis_clients"]), f"{r['orchestrator_cpu_s_per_step']:.2f}", f"{r['overhead_share']:.2%}",
            f"{r['max_rss_mb']:.0f}", str(lost),
        )  # fmt: skip
    console.print(table)
    console.print(f"written to {out}")
    return result
