"""`specrl draft init`: offline, in-domain initialization of an EAGLE-3 draft.

The target samples completions of the task's prompts (through a rollout server: the one
given, or one started here for the target, so the rollouts come from the same engine RL
will use); the target's forward over prompt + completion gives the aux hidden states and
next-token distributions; the head (fresh, shaped after the target, or an existing
draft) is fitted with the same training-time-test step online adaptation uses. Features
are taken batch by batch as training draws them, so memory stays bounded by one batch
whatever the vocabulary (a Qwen3-8B distribution is 150k floats per token).

Held-out rollouts measure top-1 agreement per draft position before and after, and the
acceptance length it implies; the result is written in the layout vLLM loads, with
`draft_init.json` recording how it was made.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from specrl.config import DraftInitConfig, resolve_model_path
from specrl.devices import local_device
from specrl.draft.eagle3 import Eagle3Head
from specrl.draft.offline import capture, evaluate_head, frequent_tokens, train_head
from specrl.draft.online import acceptance_length, pooled_agreement
from specrl.features import default_aux_layer_ids

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def sample_rollouts(cfg: DraftInitConfig, tok, progress: Progress) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of `samples_per_prompt` target samples per prompt."""
    from specrl.data.sources import PromptSource
    from specrl.launcher import ServiceProcess
    from specrl.rollout.api import RolloutClient

    server = None
    address = cfg.server
    if address is None:
        rollout = cfg.rollout.model_copy(
            update={"engine": cfg.rollout.engine.model_copy(update={"model": cfg.target})}
        )
        server = ServiceProcess(rollout).start()
        address = server.address
    try:
        with RolloutClient(address, timeout=3600) as client:
            max_len = client.status().max_model_len
            source = PromptSource(cfg.data, tok, max_prompt_tokens=max_len - cfg.max_tokens)
            prompts = [item.prompt_ids for item in source.batch(cfg.prompts)]
            out: list[tuple[list[int], list[int]]] = []
            chunk = 64
            for start in range(0, len(prompts), chunk):
                part = prompts[start : start + chunk]
                resp = client.generate(
                    part,
                    n=cfg.samples_per_prompt,
                    max_tokens=cfg.max_tokens,
                    temperature=cfg.temperature,
                    seed=cfg.seed + start,
                )
                out += [(part[s.prompt_index], list(s.token_ids)) for s in resp.samples]
                progress("rollouts", min(start + chunk, len(prompts)), len(prompts))
    finally:
        if server is not None:
            server.stop()
    return out


def _sequences(rollouts: Sequence[tuple[list[int], list[int]]]) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt + completion, with a loss mask over the positions that predict the completion."""
    seqs, masks = [], []
    for prompt, completion in rollouts:
        seq = prompt + completion
        start = max(0, len(prompt) - 1)
        seqs.append(seq)
        masks.append([0] * start + [1] * (len(seq) - 1 - start) + [0])
    return seqs, masks


@torch.no_grad()
def heldout_agreement(
    head: Eagle3Head, target, seqs, masks, aux_ids, *, pad_id: int, ttt_steps: int, batch: int = 16
) -> list[float]:
    """Token-weighted top-1 agreement per draft position, captured chunk by chunk."""
    parts = []
    for start in range(0, len(seqs), batch):
        f = capture(target, seqs[start : start + batch], masks[start : start + batch], aux_ids, pad_id=pad_id)
        parts.append((float(f.loss_mask.sum()), evaluate_head(head, f, ttt_steps)))
    return pooled_agreement(parts)


def check_draft(cfg: DraftInitConfig) -> None:
    """Refuse, before any sampling, a `start_from` draft that does not fit the target or a
    draft vocabulary larger than the target's (DraftConfigError)."""
    from transformers import AutoConfig

    from specrl.draft.service import DraftConfigError, load_head

    if cfg.start_from:
        load_head(cfg.start_from, cfg.target)
    vocab = AutoConfig.from_pretrained(resolve_model_path(cfg.target)).vocab_size
    if cfg.draft_vocab_size and cfg.draft_vocab_size > vocab:
        raise DraftConfigError(f"draft_vocab_size {cfg.draft_vocab_size} exceeds the target's {vocab} tokens")


def init_draft(cfg: DraftInitConfig, progress: Progress) -> dict:
    """Build the draft; returns what `draft_init.json` records."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    check_draft(cfg)
    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.target))
    rollouts = sample_rollouts(cfg, tok, progress)
    pad_id = tok.eos_token_id if tok.eos_token_id is not None else 0
    return fit_draft(cfg, rollouts, pad_id, progress, started=t0)


def fit_draft(
    cfg: DraftInitConfig,
    rollouts: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    progress: Progress,
    *,
    started: float | None = None,
) -> dict:
    """Fit and write the draft from the target's (prompt, completion) rollouts, on this
    process's GPU when it has one. Apart from sampling so that the fitting runs unchanged
    where no inference engine does (scripts/gpu_draft_check.py, a Qwen3-8B-shaped target
    on a GPU machine without vLLM)."""
    from transformers import AutoModelForCausalLM

    from specrl.draft.service import load_head

    t0 = time.perf_counter() if started is None else started
    device = local_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.target), dtype=dtype)
    target = target.to(device).eval()
    torch.manual_seed(cfg.seed)
    if cfg.start_from:
        head = load_head(cfg.start_from, cfg.target).to(device)
    else:
        aux = cfg.aux_layer_ids or default_aux_layer_ids(target.config.num_hidden_layers)
        vocab = target.config.vocab_size
        draft_ids = None
        if cfg.draft_vocab_size and cfg.draft_vocab_size < vocab:
            draft_ids = frequent_tokens([p + c for p, c in rollouts], vocab, cfg.draft_vocab_size)
        head = Eagle3Head.from_target(target, aux, draft_ids)
    aux_ids = head.cfg.aux_layer_ids
    seqs, masks = _sequences(rollouts)
    hold = (seqs[: cfg.holdout], masks[: cfg.holdout])
    train = (seqs[cfg.holdout :], masks[cfg.holdout :])
    kw = {"pad_id": pad_id, "ttt_steps": cfg.ttt_steps}
    before = heldout_agreement(head, target, *hold, aux_ids, **kw)

    def draw(idx: list[int]):
        return capture(target, [train[0][i] for i in idx], [train[1][i] for i in idx], aux_ids, pad_id=pad_id)

    stats = train_head(
        head,
        draw,
        len(train[0]),
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        ttt_steps=cfg.ttt_steps,
        seed=cfg.seed,
        progress=lambda done, total, _loss: progress("train", done, total),
    )
    after = heldout_agreement(head, target, *hold, aux_ids, **kw)
    out = Path(cfg.out)
    head.cpu().save(out)
    record = {
        "target": cfg.target,
        "start_from": cfg.start_from,
        "aux_layer_ids": list(aux_ids),
        "draft_vocab_size": head.cfg.draft_vocab,
        "rollouts": len(rollouts),
        "heldout_rollouts": len(hold[0]),
        "steps": cfg.steps,
        "last_loss": stats["loss"],
        "heldout_agreement_before": before,
        "heldout_agreement_after": after,
        "acceptance_estimate_before": acceptance_length(before),
        "acceptance_estimate_after": acceptance_length(after),
        "seconds": round(time.perf_counter() - t0, 1),
        "config": cfg.model_dump(mode="json"),
    }
    (out / "draft_init.json").write_text(json.dumps(record, indent=2))
    return record
