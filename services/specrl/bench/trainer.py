"""`specrl bench trainer`: time per GRPO step of specrl's trainer at TP=1/DP=1, TP=2 and
DP=2 (two processes, gloo), beside TRL's GRPOTrainer (use_vllm=False) on the same model,
the same batch and the same sequence lengths, in the same run.

The batch is fixed: prompts of the zoo task and completions sampled once from the zoo
target. TRL normally generates inside its step; here its generation is replaced by a
lookup of those same completions (`_FixedCompletionsGRPO`), so both trainers spend their
step on the same work: scoring (TRL calls its reward function), logprobs, loss, backward
and the optimizer. Everything runs on CPU with the same torch; the median step after a
warm-up step is reported.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.multiprocessing as mp
from rich.console import Console

from specrl import shutdown
from specrl.config import TrainerConfig, resolve_model_path
from specrl.launcher import free_port
from specrl.tables import markdown_table, print_table
from specrl.trainer.api import Rollout

GROUP = 8  # samples per prompt
MAX_TOKENS = 48
LR = 1e-5
EPS_LOW, EPS_HIGH = 0.2, 0.28

# (label, tp, dp): the specrl layouts measured; 2-process layouts use one thread each
LAYOUTS = (("tp1-dp1", 1, 1), ("tp2", 2, 1), ("dp2", 1, 2))


def fixed_batch(prompts: int, seed: int = 0) -> tuple[list[str], list[Rollout]]:
    """`prompts` task prompts x GROUP completions sampled from the zoo target (temperature
    1), rewarded by the task's checker; rollouts are grouped by prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specrl.data import task
    from specrl.zoo.build import ZooSpec, task_kwargs
    from specrl.zoo.rollouts import sample_completions

    path = resolve_model_path("zoo:target")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    problems = task.take(prompts, seed=seed, split="train", **task_kwargs(ZooSpec()))
    texts = [p.prompt for p in problems]
    repeated = [t for t in texts for _ in range(GROUP)]
    comps = sample_completions(model, tok, repeated, max_new_tokens=MAX_TOKENS, temperature=1.0, seed=seed)
    rollouts = []
    for i, c in enumerate(comps):
        p = problems[i // GROUP]
        c = c or [tok.eos_token_id]
        ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
        rollouts.append(Rollout(ids, c, task.reward(tok.decode(c, skip_special_tokens=True), p.answer)))
    return texts, rollouts


def _trainer_config(tp: int, dp: int, micro: int) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "model": "zoo:target",
            "tp": tp,
            "dp": dp,
            "micro_batch_size": micro,
            "grpo": {"eps_low": EPS_LOW, "eps_high": EPS_HIGH},
            "optim": {"lr": LR, "grad_clip": 1.0},
        }
    )


def _specrl_steps(cfg: TrainerConfig, rollouts: list[Rollout], steps: int) -> list[dict]:
    from specrl.trainer.batch import collate
    from specrl.trainer.state import TrainState
    from specrl.trainer.step import train_step

    state = TrainState.build(cfg)
    batch = collate(rollouts, state.vocab_size)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        m = train_step(state, batch, group_size=GROUP)
        out.append(
            {
                "step_seconds": time.perf_counter() - t0,
                "logprob_seconds": m.logprob_seconds,
                "train_seconds": m.train_seconds,
                "tokens": m.tokens,
            }
        )
    return out


def _rank(rank: int, world: int, port: int, tp: int, dp: int, micro: int, data: str, steps: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # two processes on two cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = _specrl_steps(_trainer_config(tp, dp, micro), torch.load(data, weights_only=False), steps)
    if rank == 0:
        Path(data).with_suffix(".out").write_text(json.dumps(result))
    shutdown.exit_now(0)


def run_specrl(tp: int, dp: int, rollouts: list[Rollout], *, steps: int, micro: int) -> list[dict]:
    """Per-step timings of specrl's trainer in this layout (rank 0's view)."""
    if tp * dp == 1:
        return _specrl_steps(_trainer_config(1, 1, micro), rollouts, steps)
    with tempfile.TemporaryDirectory(prefix="specrl-bench-trainer-") as d:
        data = Path(d) / "batch.pt"
        torch.save(rollouts, data)
        args = (tp * dp, free_port(), tp, dp, micro, str(data), steps)
        mp.start_processes(_rank, args=args, nprocs=tp * dp, start_method="spawn")
        return json.loads(data.with_suffix(".out").read_text())


def run_trl(prompts: list[str], rollouts: list[Rollout], *, steps: int, micro: int) -> list[dict]:
    """Per-step timings of TRL's GRPOTrainer on the same batch (generation replaced by a
    lookup of the fixed completions)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    path = resolve_model_path("zoo:target")
    tok = AutoTokenizer.from_pretrained(path)
    by_prompt: dict[tuple[int, ...], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by_prompt[tuple(r.prompt_ids)].append(r)
    reward_of = {(tuple(r.prompt_ids), tuple(r.completion_ids)): r.reward for r in rollouts}

    served: dict[tuple[int, ...], int] = defaultdict(int)

    class _FixedCompletionsGRPO(GRPOTrainer):
        """GRPOTrainer whose generation returns the benchmark's fixed completions."""

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
            out = []
            for ids in prompt_ids:
                key = tuple(ids)
                group = by_prompt[key]
                out.append(list(group[served[key] % len(group)].completion_ids))
                served[key] += 1
            return out, None

    def reward(prompts, completions, completion_ids, **kw) -> list[float]:
        keys = [tuple(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        return [reward_of[(k, tuple(c))] for k, c in zip(keys, completion_ids)]

    ends: list[float] = []

    class _StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    batch = len(rollouts)
    with tempfile.TemporaryDirectory(prefix="specrl-bench-trl-") as d:
        args = GRPOConfig(
            output_dir=d,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=batch // micro,  # one optimizer step per batch, as specrl
            num_generations=GROUP,
            max_completion_length=MAX_TOKENS,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=0.0,
            epsilon=EPS_LOW,
            epsilon_high=EPS_HIGH,
            loss_type="dapo",  # token-level over the whole batch, as specrl
            max_grad_norm=1.0,
            num_iterations=1,
            max_steps=steps,
            logging_steps=steps,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=0,
            disable_tqdm=True,
        )
        trainer = _FixedCompletionsGRPO(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tok,
            callbacks=[_StepTimes()],
        )
        start = time.perf_counter()
        trainer.train()
    tokens = sum(len(r.completion_ids) for r in rollouts)
    times = [b - a for a, b in zip([start, *ends], ends)]
    return [{"step_seconds": t, "tokens": tokens} for t in times]


def _row(trainer: str, layout: str, processes: int, steps: list[dict], samples: int) -> dict:
    timed = steps[1:] or steps  # the first step warms up (allocations, thread pools)
    med = {k: statistics.median(s[k] for s in timed) for k in timed[0] if k != "tokens"}
    tokens = timed[0]["tokens"]
    row = {
        "trainer": trainer,
        "layout": layout,
        "processes": processes,
        "threads_per_process": 1 if processes > 1 else torch.get_num_threads(),
        "samples": samples,
        "tokens": tokens,
        "step_seconds": round(med["step_seconds"], 4),
        "step_seconds_all": [round(s["step_seconds"], 4) for s in timed],
        "tokens_per_s": round(tokens / med["step_seconds"], 1),
        "logprob_seconds": None,
        "train_seconds": None,
        "logprob_tokens_per_s": None,
        "train_tokens_per_s": None,
    }
    if "logprob_seconds" in med:
        row |= {
            "logprob_seconds": round(med["logprob_seconds"], 4),
            "train_seconds": round(med["train_seconds"], 4),
            "logprob_tokens_per_s": round(tokens / med["logprob_seconds"], 1),
            "train_tokens_per_s": round(tokens / med["train_seconds"], 1),
        }
    return row


def run_trainer_bench(
    out: Path, *, prompts: int = 16, steps: int = 6, micro: int = 32, console: Console
) -> list[dict]:
    if (prompts * GROUP) % micro:
        raise ValueError(f"micro-batch {micro} must divide the batch ({prompts} x {GROUP})")
    console.print(f"sampling the fixed batch: {prompts} prompts x {GROUP} completions")
    texts, rollouts = fixed_batch(prompts)
    rows = []
    for label, tp, dp in LAYOUTS:
        console.print(f"specrl {label}: {steps} steps")
        timings = run_specrl(tp, dp, rollouts, steps=steps, micro=micro)
        rows.append(_row("specrl", label, tp * dp, timings, len(rollouts)))
    console.print(f"TRL GRPOTrainer: {steps} steps")
    rows.append(_row("trl", "tp1-dp1", 1, run_trl(texts, rollouts, steps=steps, micro=micro), len(rollouts)))
    trl = rows[-1]["step_seconds"]
    for r in rows:
        r["speedup_vs_trl"] = round(trl / r["step_seconds"], 3)
    _write(out, rows, prompts=prompts, steps=steps, micro=micro)
    print_table(rows, TABLE_COLUMNS, "trainer benchmark (median step)", console)
    return rows


TABLE_COLUMNS = (
    "trainer",
    "layout",
    "samples",
    "tokens",
    "step_seconds",
    "tokens_per_s",
    "logprob_tokens_per_s",
    "train_tokens_per_s",
    "speedup_vs_trl",
)


def _write(out: Path, rows: list[dict], *, prompts: int, steps: int, micro: int) -> None:
    import trl

    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": f"specrl bench trainer --out {out}",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "trl": trl.__version__,
        "model": "zoo:target (float32)",
        "batch": f"{prompts} prompts x {GROUP} samples, completions <= {MAX_TOKENS} tokens",
        "micro_batch": micro,
        "steps": steps,
        "what": "median wall time of one GRPO optimizer step after a warm-up step; same fixed batch",
        "work": "specrl's step includes an old-policy logprob pass (its logprob column); TRL's "
        "(num_iterations=1, beta=0) reuses the training forward's logprobs and has no such pass",
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown_table(rows, TABLE_COLUMNS) + "\n")
    _plot(out.with_suffix(".png"), rows)


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['trainer']}\n{r['layout']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    lp = [r["logprob_seconds"] or 0.0 for r in rows]
    train = [r["train_seconds"] if r["train_seconds"] is not None else r["step_seconds"] for r in rows]
    other = [max(r["step_seconds"] - a - b, 0.0) for r, a, b in zip(rows, lp, train)]
    ax.bar(labels, lp, label="logprob (old-policy pass)")
    ax.bar(labels, train, bottom=lp, label="train (fwd + bwd + optimizer); TRL: whole step")
    ax.bar(labels, other, bottom=[a + b for a, b in zip(lp, train)], label="other")
    for i, r in enumerate(rows):
        ax.text(i, r["step_seconds"], f"{r['speedup_vs_trl']:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds per GRPO step (median)")
    ax.set_title("specrl trainer vs TRL GRPOTrainer (zoo target, CPU; label: speedup vs TRL)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
