"""`specrl zoo build`: the tiny deterministic CPU testbed, built once and cached.

Everything is a function of the seed and of BUILD_VERSION; a cached build whose manifest
key matches is reused, so tests and demos share one build. Builds are written to a
temporary directory and renamed into place, under a file lock, so a crash never leaves a
half-built zoo and concurrent builders do not collide.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from specrl.config import ZOO_SCHEME, specrl_home
from specrl.zoo.isolated import fingerprint, run_isolated

# Bump when anything below changes what gets built (4: built in a fixed numeric
# environment, zoo/isolated.py; 5: the tokenizer's chat template, the models unchanged).
BUILD_VERSION = 5
# What the default spec takes on 2 idle CPU cores (measured; shown before a build).
BUILD_MINUTES = 8


@dataclass(frozen=True)
class ZooSpec:
    """Sizes and budgets of the zoo. The defaults build in about BUILD_MINUTES minutes on
    2 idle CPU cores, most of it the target's training (docs/design.md "Tiny model zoo")."""

    # task: one operation on small operands, so a model trained for minutes on a CPU
    # solves some, not all, problems (with 2-3 terms 450 steps reached 0.09 and build 2
    # needed 900 steps; docs/design.md)
    max_operand: int = 20
    max_terms: int = 2
    corpus_size: int = 20000
    # target (Qwen3 architecture)
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 12
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    # 500 steps: test accuracy greedy 0.48 / sampled 0.33, answers in the task's format
    # that miss by one or two, which RL sharpens (400 steps: 0.19; docs/design.md)
    target_steps: int = 500
    target_batch: int = 64
    target_lr: float = 3e-3
    # rollouts of the target that train the domain draft
    rollouts: int = 2048
    rollout_max_tokens: int = 48
    # EAGLE-3 heads
    eagle_steps: int = 250
    eagle_batch: int = 64
    eagle_lr: float = 3e-3
    eagle_ttt_steps: int = 4
    generic_texts: int = 2048
    generic_max_tokens: int = 40  # about the task's prompt + rollout: same cost per step
    # external draft model (draft_model method)
    draft_layers: int = 2
    draft_steps: int = 200
    draft_lr: float = 3e-3

    def key(self, seed: int) -> str:
        blob = json.dumps({"v": BUILD_VERSION, "seed": seed, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def zoo_root() -> Path:
    return specrl_home() / "zoo"


def zoo_seed() -> int:
    """The seed of the zoo every command builds or reuses: $SPECRL_ZOO_SEED, else 0. One
    setting for all of them (a zoo built with another seed is another zoo: checking the
    suite against one finds tests that hold on one build only, docs/design.md)."""
    value = os.environ.get("SPECRL_ZOO_SEED", "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"SPECRL_ZOO_SEED must be an integer, got {value!r}") from None


def task_kwargs(spec: ZooSpec) -> dict:
    return {"max_operand": spec.max_operand, "max_terms": spec.max_terms}


@contextmanager
def locked(root: Path):
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_manifest(root: Path) -> dict | None:
    path = root / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def build_if_used(refs: Iterable[str], console: Console | None = None) -> None:
    """Build the zoo (or reuse the cached build) when a model reference a command is about
    to load names it (zoo:NAME); the product only resolves such references."""
    if any(r.startswith(ZOO_SCHEME) for r in refs):
        build_zoo(console=console)


def build_zoo(
    root: Path | None = None,
    *,
    seed: int | None = None,
    spec: ZooSpec | None = None,
    force: bool = False,
    console: Console | None = None,
) -> dict:
    """Build the zoo at `root` unless an identical build is cached; returns the manifest.
    `seed`: None for `zoo_seed()`.

    An interrupted build with the same key resumes at its first unfinished stage."""
    root = root or zoo_root()
    seed = zoo_seed() if seed is None else seed
    spec = spec or ZooSpec()
    console = console or Console(stderr=True)
    key = spec.key(seed)
    with locked(root):
        manifest = load_manifest(root)
        if manifest and manifest.get("key") == key and not force:
            return manifest
        took = f", ~{BUILD_MINUTES} minutes on 2 cores" if spec == ZooSpec() else ""
        if manifest and not force:
            console.print(
                f"[yellow]the zoo at {root} was built from another spec (key {manifest.get('key')}, "
                f"this specrl wants {key}): building it again{took}[/yellow]"
            )
        elif not force:
            console.print(f"building the tiny model zoo at {root} (once{took})")
        return install(
            root,
            key,
            force,
            lambda tmp: run_isolated(
                "specrl.zoo.build:build_isolated", tmp, seed=seed, spec=asdict(spec), quiet=console.quiet
            ),
        )


def install(dest: Path, key: str, force: bool, build: Callable[[Path], dict]) -> dict:
    """Run `build` in a staging directory beside `dest` and rename the result into place,
    so a crash never leaves a half-built directory; an interrupted build of the same key
    resumes in its staging directory (its finished stages are kept). Call under `locked`."""
    tmp = dest.parent / f".{dest.name}.building"
    key_file = tmp / "key"
    if force or not key_file.exists() or key_file.read_text() != key:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        key_file.write_text(key)
    manifest = build(tmp)
    manifest["key"] = key
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    old = dest.parent / f".{dest.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return manifest


class Stages:
    """Runs named build stages once: a finished stage leaves `<name>.done.json` with its
    manifest entry, and a resumed build reuses it instead of running the stage again."""

    def __init__(self, out: Path, console: Console) -> None:
        self.out, self.console = out, console

    def run(self, name: str, fn: Callable[[Progress], dict]) -> dict:
        marker = self.out / f"{name}.done.json"
        if marker.exists():
            self.console.print(f"  [dim]{name}: reused from an interrupted build[/dim]")
            return json.loads(marker.read_text())
        t0 = time.perf_counter()
        last = [-1]

        def progress(step: int, total: int, loss: float) -> None:
            decile = step * 10 // total
            if decile != last[0]:
                last[0] = decile
                el = time.perf_counter() - t0
                self.console.print(f"  [dim]{name}: step {step}/{total} loss {loss:.3f} ({el:.0f}s)[/dim]")

        info = fn(progress)
        info["seconds"] = round(time.perf_counter() - t0, 1)
        marker.write_text(json.dumps(info))
        return info


Progress = Callable[[int, int, float], None]


def build_isolated(out: Path, *, seed: int, spec: dict, quiet: bool) -> dict:
    """The build in its child process (`isolated.run_isolated`): the manifest, with the
    models' fingerprint."""
    manifest = _build(out, seed=seed, spec=ZooSpec(**spec), console=Console(stderr=True, quiet=quiet))
    return manifest | {"fingerprint": fingerprint(out, list(manifest["models"]))}


def _build(out: Path, *, seed: int, spec: ZooSpec, console: Console) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from specrl.data import task
    from specrl.zoo import tokenizer
    from specrl.zoo.pretrain import train_causal_lm
    from specrl.zoo.rollouts import test_accuracy

    t_start = time.perf_counter()
    stages = Stages(out, console)
    tk = task_kwargs(spec)
    target_dir = out / "target"
    tokenizer.build(target_dir)
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    cfg = Qwen3Config(
        vocab_size=tokenizer.VOCAB_SIZE,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        torch_dtype="float32",
        # training only (not saved): on 2 CPU cores eager attention trained a step in
        # 0.49-0.58 s against sdpa's 0.53-0.69 s at these lengths; vLLM serves with its
        # own attention
        attn_implementation="eager",
    )
    corpus = [p.prompt + p.solution for p in task.take(spec.corpus_size, seed=seed, **tk)]

    # -- target ----------------------------------------------------------------------------
    def build_target(progress: Progress) -> dict:
        console.print(f"[bold]target[/bold]: Qwen3, {spec.num_layers} layers, hidden {spec.hidden_size}")
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
        train_causal_lm(
            model,
            tok,
            corpus,
            steps=spec.target_steps,
            batch_size=spec.target_batch,
            lr=spec.target_lr,
            seed=seed,
            progress=progress,
        )
        model.save_pretrained(str(target_dir))
        test = task.take(256, seed=seed + 1, split="test", **tk)
        acc = test_accuracy(model, tok, test, seed=seed, max_new_tokens=48)
        n_params = sum(p.numel() for p in model.parameters())
        return {
            "summary": f"Qwen3 {n_params / 1e6:.1f}M params, {accuracy_summary(acc, console)}",
            "params": n_params,
            **acc,
        }

    models = {"target": stages.run("target", build_target)}
    target = Qwen3ForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()

    # -- target rollouts: the drafts' in-domain data ---------------------------------------
    prompts = [p.prompt for p in task.take(spec.rollouts, seed=seed + 2, **tk)]
    completions, _ = sample_rollouts(
        stages, target, tok, prompts, max_new_tokens=spec.rollout_max_tokens, seed=seed
    )

    # -- EAGLE-3 heads: domain init and generic init ---------------------------------------
    models |= build_eagle_heads(
        stages, out, target, tok, spec, seed=seed, prompts=prompts, completions=completions
    )

    # -- external draft model (same tokenizer, fewer layers) -------------------------------
    def build_draft(progress: Progress) -> dict:
        fields = {k: v for k, v in cfg.to_dict().items() if k != "layer_types"}
        draft_cfg = Qwen3Config(**{**fields, "num_hidden_layers": spec.draft_layers})
        torch.manual_seed(seed)
        draft = Qwen3ForCausalLM(draft_cfg)
        texts = [p + tok.decode(c, skip_special_tokens=True) for p, c in zip(prompts, completions)]
        train_causal_lm(
            draft,
            tok,
            texts + corpus[: len(texts)],
            steps=spec.draft_steps,
            batch_size=spec.target_batch,
            lr=spec.draft_lr,
            seed=seed,
            progress=progress,
        )
        draft.save_pretrained(str(out / "draft"))
        tok.save_pretrained(str(out / "draft"))
        n = sum(p.numel() for p in draft.parameters())
        return {"summary": f"Qwen3 {spec.draft_layers} layers, {n / 1e6:.1f}M params", "params": n}

    models["draft"] = stages.run("draft", build_draft)
    return {
        "seed": seed,
        "build_version": BUILD_VERSION,
        "spec": asdict(spec),
        "task": {"name": "arithmetic", **tk},
        "models": models,
        "seconds": round(time.perf_counter() - t_start, 1),
    }


def accuracy_summary(acc: dict[str, float], console: Console) -> str:
    """Print a target's test accuracy (`rollouts.test_accuracy`); its manifest summary."""
    text = (
        f"test accuracy greedy {acc['test_accuracy_greedy']:.2f} / sampled {acc['test_accuracy_sampled']:.2f}"
    )
    console.print(f"  [dim]target: {text}[/dim]")
    return text


def sample_rollouts(
    stages: Stages, target, tok, prompts: list[str], *, max_new_tokens: int, seed: int
) -> tuple[list[list[int]], dict]:
    """The target's completions of `prompts` at temperature 1 (the drafts' in-domain
    data), as the build stage `rollouts`: token ids per prompt, and the stage's entry."""
    from specrl.zoo.rollouts import sample_completions

    path = stages.out / "rollouts.json"

    def run(progress: Progress) -> dict:
        comps = sample_completions(
            target, tok, prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed
        )
        path.write_text(json.dumps(comps))
        mean = sum(map(len, comps)) / len(comps)
        stages.console.print(
            f"  [dim]rollouts: {len(comps)} target samples, {mean:.0f} tokens on average[/dim]"
        )
        return {"count": len(comps), "mean_tokens": round(mean, 1)}

    info = stages.run("rollouts", run)
    return json.loads(path.read_text()), info


def build_eagle_heads(
    stages: Stages,
    out: Path,
    target,
    tok,
    spec: ZooSpec,
    *,
    seed: int,
    prompts: list[str],
    completions: list[list[int]],
) -> dict:
    """The two EAGLE-3 heads of one target, as build stages: `eagle3-domain` trained on the
    target's own completions of task prompts (a held-out share kept for the agreement
    figure), `eagle3-generic` on generic text the target never saw in its domain; both
    scored on the same held-out completions. Returns their manifest entries."""
    import torch

    from specrl.draft.eagle3 import Eagle3Head
    from specrl.draft.offline import capture, evaluate_head, train_head
    from specrl.features import default_aux_layer_ids
    from specrl.zoo import generic_text

    aux_ids = default_aux_layer_ids(target.config.num_hidden_layers)

    def with_masks(prefixes: list[str], bodies: list[list[int]]) -> tuple[list, list]:
        seqs, masks = [], []
        for prefix, body in zip(prefixes, bodies):
            pids = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
            seq = pids + body
            start = max(0, len(pids) - 1)  # first target position that predicts the body
            seqs.append(seq)
            masks.append([0] * start + [1] * (len(seq) - 1 - start) + [0])
        return seqs, masks

    dom_seqs, dom_masks = with_masks(prompts, completions)
    n_hold = min(max(64, len(dom_seqs) // 16), len(dom_seqs) // 2)  # held-out rollouts
    generic = generic_text.corpus(spec.generic_texts, seed=seed + 3)
    gen_ids = [tok(g, add_special_tokens=False)["input_ids"][: spec.generic_max_tokens] for g in generic]
    gen_seqs, gen_masks = with_masks([""] * len(gen_ids), gen_ids)
    models = {}
    for name, seqs, masks in (
        ("eagle3-domain", dom_seqs[n_hold:], dom_masks[n_hold:]),
        ("eagle3-generic", gen_seqs, gen_masks),
    ):

        def build_eagle(progress: Progress, seqs=seqs, masks=masks, name=name) -> dict:
            feats = capture(target, seqs, masks, aux_ids, pad_id=tok.eos_token_id)
            torch.manual_seed(seed)
            head = Eagle3Head.from_target(target, aux_ids)
            train_head(
                head,
                feats.select,
                len(feats.input_ids),
                steps=spec.eagle_steps,
                batch_size=spec.eagle_batch,
                lr=spec.eagle_lr,
                ttt_steps=spec.eagle_ttt_steps,
                seed=seed,
                progress=progress,
            )
            hold = capture(target, dom_seqs[:n_hold], dom_masks[:n_hold], aux_ids, pad_id=tok.eos_token_id)
            agree = evaluate_head(head, hold, spec.eagle_ttt_steps)
            head.save(out / name)
            return {
                "summary": f"EAGLE-3 head, aux layers {list(aux_ids)}, held-out top-1 agreement "
                + "/".join(f"{a:.2f}" for a in agree),
                "aux_layer_ids": list(aux_ids),
                "heldout_top1_agreement": agree,
            }

        models[name] = stages.run(name, build_eagle)
    return models
