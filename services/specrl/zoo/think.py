"""`specrl zoo build --think`: the zoo's "RL-Think" variant, an optional stage on top of
the zoo (built once, cached in `<zoo>/think`, served as `zoo:think/NAME`).

The paper measures two regimes: RL-Zero (short answers from a base model) and RL-Think
(long reasoning traces from an SFT'd model, harder to draft). The zoo's target is the
RL-Zero policy. Its RL-Think counterpart is the same target fine-tuned on worked solutions
that think out loud (`task.reasoning_trace`: about 3-4x as long, with uncertain wording
and random splits between stretches of forced arithmetic), with its own EAGLE-3 heads:
domain (trained on its own traces) and generic (generic text through its features).

Optional because it is not needed by the tests or the demo, only by `specrl bench draft`'s
RL-Think column, and it would add about THINK_MINUTES to every fresh build.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from specrl.zoo.build import (
    Progress,
    Stages,
    ZooSpec,
    accuracy_summary,
    build_eagle_heads,
    build_zoo,
    install,
    load_manifest,
    locked,
    sample_rollouts,
    task_kwargs,
    zoo_root,
    zoo_seed,
)
from specrl.zoo.isolated import fingerprint, run_isolated

# What the default ThinkSpec adds to a built zoo on 2 idle CPU cores (measured).
THINK_MINUTES = 13
THINK_DIR = "think"


@dataclass(frozen=True)
class ThinkSpec:
    """Budgets of the RL-Think variant (the model sizes are the zoo's)."""

    corpus_size: int = 8000  # prompts with a reasoning trace each (SFT data)
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 3e-3
    rollouts: int = 1024  # the fine-tuned target's own traces: the domain head's data
    rollout_max_tokens: int = 160  # traces run to ~135 characters (tokens) past the prompt

    def key(self, base_key: str) -> str:
        blob = json.dumps({"base": base_key, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_think(
    root: Path | None = None,
    *,
    seed: int | None = None,
    spec: ZooSpec | None = None,
    think: ThinkSpec | None = None,
    force: bool = False,
    console: Console | None = None,
) -> dict:
    """Build (or reuse) the zoo at `root` and its RL-Think variant in `root/think`;
    returns the variant's manifest. Rebuilt whenever the zoo under it is."""
    root = root or zoo_root()
    seed = zoo_seed() if seed is None else seed
    spec = spec or ZooSpec()
    think = think or ThinkSpec()
    console = console or Console(stderr=True)
    base = build_zoo(root, seed=seed, spec=spec, console=console)
    dest = root / THINK_DIR
    with locked(root):
        if (load_manifest(root) or {}).get("key") != base["key"]:
            raise RuntimeError(f"the zoo at {root} changed while the RL-Think variant waited: build again")
        key = think.key(base["key"])
        manifest = load_manifest(dest)
        if manifest and manifest.get("key") == key and not force:
            return manifest
        took = f", ~{THINK_MINUTES} minutes on 2 cores" if think == ThinkSpec() else ""
        console.print(f"building the zoo's RL-Think variant at {dest} (once{took})")
        return install(
            dest,
            key,
            force,
            lambda tmp: run_isolated(
                "specrl.zoo.think:build_isolated",
                tmp,
                base=str(root),
                seed=seed,
                spec=asdict(spec),
                think=asdict(think),
                quiet=console.quiet,
            ),
        )


def build_isolated(out: Path, *, base: str, seed: int, spec: dict, think: dict, quiet: bool) -> dict:
    """The variant's build in its child process (`isolated.run_isolated`), fingerprinted."""
    console = Console(stderr=True, quiet=quiet)
    manifest = _build(
        out, Path(base), seed=seed, spec=ZooSpec(**spec), think=ThinkSpec(**think), console=console
    )
    return manifest | {"fingerprint": fingerprint(out, list(manifest["models"]))}


def _build(out: Path, base: Path, *, seed: int, spec: ZooSpec, think: ThinkSpec, console: Console) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from specrl.data import task
    from specrl.zoo.pretrain import train_causal_lm
    from specrl.zoo.rollouts import test_accuracy

    t_start = time.perf_counter()
    stages = Stages(out, console)
    tk = task_kwargs(spec)
    target_dir = out / "target"
    tok = AutoTokenizer.from_pretrained(str(base / "target"))

    def build_target(progress: Progress) -> dict:
        console.print("[bold]think target[/bold]: the zoo target fine-tuned on reasoning traces")
        rng = random.Random(seed)
        corpus = [
            p.prompt + task.reasoning_trace(p, rng) for p in task.take(think.corpus_size, seed=seed, **tk)
        ]
        # eager attention for training, as the zoo's target (not saved: vLLM serves with its own)
        model = Qwen3ForCausalLM.from_pretrained(
            str(base / "target"), dtype=torch.float32, attn_implementation="eager"
        )
        train_causal_lm(
            model,
            tok,
            corpus,
            steps=think.sft_steps,
            batch_size=think.sft_batch,
            lr=think.sft_lr,
            seed=seed,
            progress=progress,
        )
        model.save_pretrained(str(target_dir))
        tok.save_pretrained(str(target_dir))
        test = task.take(128, seed=seed + 1, split="test", **tk)  # fewer: 160-token answers
        acc = test_accuracy(model, tok, test, seed=seed, max_new_tokens=think.rollout_max_tokens)
        return {
            "summary": f"zoo target + {think.sft_steps} SFT steps on reasoning traces, "
            + accuracy_summary(acc, console),
            **acc,
        }

    models = {"target": stages.run("target", build_target)}
    target = Qwen3ForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    prompts = [p.prompt for p in task.take(think.rollouts, seed=seed + 2, **tk)]
    completions, rollouts = sample_rollouts(
        stages, target, tok, prompts, max_new_tokens=think.rollout_max_tokens, seed=seed
    )
    models |= build_eagle_heads(
        stages, out, target, tok, spec, seed=seed, prompts=prompts, completions=completions
    )
    return {
        "seed": seed,
        "think_spec": asdict(think),
        "task": {"name": "arithmetic", "solutions": "reasoning traces", **tk},
        "rollout_mean_tokens": rollouts["mean_tokens"],
        "models": models,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
