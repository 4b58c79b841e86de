"""Online adaptation on the zoo: the generic-init EAGLE-3 draft, trained by the
draft-trainer's core on features taken by the trainer's own capture code (Capturer, the
zoo target's forward over its task rollouts), ends with a clearly higher held-out
acceptance estimate than the same draft frozen, on the same held-out batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specrl.config import CaptureConfig, DraftTrainingConfig
from specrl.draft.eagle3 import Eagle3Head
from specrl.draft.offline import pad
from specrl.draft.online import OnlineDraftTrainer, acceptance_length
from specrl.trainer.capture import Capturer

pytestmark = [pytest.mark.zoo]

BATCH, BATCHES = 32, 40


def _task_sequences(root: Path, tok) -> tuple[list[list[int]], list[list[int]]]:
    """The zoo's target rollouts after their prompts (regenerated as the build drew them),
    with the completion positions marked as [L-1] prediction masks."""
    from specrl.data import task
    from specrl.zoo.build import ZooSpec, task_kwargs

    spec = ZooSpec()
    completions = json.loads((root / "rollouts.json").read_text())
    prompts = [p.prompt for p in task.take(spec.rollouts, seed=2, **task_kwargs(spec))]
    seqs, masks = [], []
    for prompt, body in zip(prompts, completions):
        pids = tok(prompt, add_special_tokens=False)["input_ids"]
        seqs.append(pids + body)
        masks.append([0] * (len(pids) - 1) + [1] * len(body))
    return seqs, masks


def test_online_adaptation_lifts_the_generic_draft_above_the_same_draft_frozen(zoo):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    root = Path(zoo["root"])
    tok = AutoTokenizer.from_pretrained(str(root / "target"))
    target = Qwen3ForCausalLM.from_pretrained(str(root / "target"), dtype=torch.float32).eval()
    embed = target.get_input_embeddings().weight
    capturer = Capturer(CaptureConfig(enabled=True), target.config.num_hidden_layers, seed=0)
    seqs, masks = _task_sequences(root, tok)
    cfg = DraftTrainingConfig(lr=1e-3, holdout_every=5, holdout_batches=8)
    adapted = OnlineDraftTrainer(Eagle3Head.load(root / "eagle3-generic", embed), cfg)
    frozen = OnlineDraftTrainer(Eagle3Head.load(root / "eagle3-generic", embed), cfg)
    assert list(adapted.head.cfg.aux_layer_ids) == list(capturer.aux_layer_ids)

    for b in range(BATCHES):
        sl = slice(b * BATCH, (b + 1) * BATCH)
        ids, attn, mask = pad(seqs[sl], masks[sl], tok.eos_token_id)
        with torch.no_grad():
            out = target(input_ids=ids, attention_mask=attn, output_hidden_states=True)
        logprobs = torch.log_softmax(out.logits[:, :-1].float(), -1)
        batch = capturer.capture(out.hidden_states, logprobs, ids, attn, mask[:, :-1], policy_version=b)
        if not adapted.submit(batch):
            frozen.holdout.append(adapted.holdout[-1])  # the same held-out batches for both

    before, after = frozen.evaluate(), adapted.evaluate()
    al_before, al_after = acceptance_length(before), acceptance_length(after)
    print(f"held-out top-1 agreement {before} -> {after}; acceptance {al_before:.2f} -> {al_after:.2f}")
    assert adapted.stats.steps == BATCHES - BATCHES // 5 and adapted.stats.refused == 0
    assert al_after > al_before + 0.3, (before, after)
