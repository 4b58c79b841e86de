"""GPU check of the draft code at Qwen3-8B's shape, run from the repository root:
`PYTHONPATH=services python scripts/gpu_draft_check.py [--shape qwen3-8b|tiny] [--out F]`.

No hub is reachable and the GPU machine has no vLLM, so the target is a randomly
initialized model with Qwen3-8B's published configuration (36 layers, hidden 4096,
vocabulary 151,936; bf16, ~16 GB), saved and loaded back as a checkpoint, and its
rollouts are sampled with transformers' `generate` instead of a rollout server. From
there the code is the product's, unchanged: `specrl draft init`'s fitting
(`fit_draft`: capture of aux hidden states and target distributions, training-time
test, held-out agreement, the head written in vLLM's layout), then the draft-trainer's
online path (`load_head` against the target checkpoint, the trainer's `Capturer` with a
top-k capture, `OnlineDraftTrainer` steps and held-out evaluation). Prints seconds and
peak GPU memory per phase; `--out` writes them as JSON. `--draft-vocab N` fits a head
over the N target tokens most frequent in the rollouts (EAGLE-3's smaller output layer).
`--shape tiny` runs the same steps on a small model (the CPU dry run). Results are
recorded in docs/draft.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    # Qwen3-8B's config.json (hub: Qwen/Qwen3-8B)
    "qwen3-8b": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=151645,
    ),
    "tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=1,
    ),
}  # fmt: skip


class Phases:
    """Seconds and peak GPU memory of each phase, printed as they end."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.rows = device, {}

    def run(self, name: str, fn, *args, **kw):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        row = {"seconds": round(time.perf_counter() - t0, 2)}
        if self.device.type == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        self.rows[name] = row
        print(f"{name}: {row}", flush=True)
        return out


def build_target(shape: dict, out: Path, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**shape)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device.type == "cuda" else None)
    model.save_pretrained(out)
    return model.eval()


@torch.no_grad()
def sample(model, n: int, prompt_len: int, new: int, vocab: int, eos: int) -> list:
    """(prompt, completion) pairs: random prompts, completions sampled from the target."""
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, vocab, (n, prompt_len), generator=g).to(model.device)
    out = model.generate(
        prompts, attention_mask=torch.ones_like(prompts), do_sample=True, max_new_tokens=new,
        min_new_tokens=new, pad_token_id=eos,
    )  # fmt: skip
    return [(p.tolist(), c.tolist()) for p, c in zip(prompts, out[:, prompt_len:])]


def online_steps(
    model, head_dir: Path, target_dir: Path, rollouts, *, batches: int, per_batch: int, topk: int
) -> dict:
    """The draft-trainer's path: the saved head loaded against the target, top-k
    captures from the target's forward, online TTT steps with every 4th batch held out."""
    from specrl.config import CaptureConfig, DraftTrainingConfig
    from specrl.draft.online import OnlineDraftTrainer, acceptance_length
    from specrl.draft.service import load_head
    from specrl.trainer.capture import Capturer

    device = model.device
    head = load_head(str(head_dir), str(target_dir)).to(device)
    trainer = OnlineDraftTrainer(head, DraftTrainingConfig(holdout_every=4, holdout_batches=4))
    cap = Capturer(
        CaptureConfig(enabled=True, aux_layer_ids=head.cfg.aux_layer_ids, topk=topk),
        model.config.num_hidden_layers, seed=0,
    )  # fmt: skip
    submit_s = []
    for b in range(batches):
        part = rollouts[(b * per_batch) % len(rollouts) :][:per_batch]
        ids = torch.tensor([p + c for p, c in part], device=device)
        attn = torch.ones_like(ids)
        mask = torch.zeros(ids.shape[0], ids.shape[1] - 1)
        mask[:, len(part[0][0]) - 1 :] = 1
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
            lp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
        batch = cap.capture(out.hidden_states, lp, ids, attn, mask, policy_version=b)
        del out, lp
        t0 = time.perf_counter()
        trainer.submit(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        submit_s.append(round(time.perf_counter() - t0, 3))
    agreement = trainer.evaluate()
    return {
        "steps": trainer.stats.steps,
        "held_out_batches": len(trainer.holdout),
        "last_loss": trainer.stats.last_loss,
        "submit_seconds": submit_s,
        "heldout_agreement": agreement,
        "acceptance_estimate": acceptance_length(agreement),
        "head_device": str(next(head.parameters()).device),
        "captured_target_logprobs": list(batch.target_logprobs.shape),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--draft-vocab", type=int, help="draft_vocab_size of the fresh head (default: all)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from safetensors.torch import load_file

    from specrl.config import DraftInitConfig
    from specrl.devices import local_device
    from specrl.draft.init import fit_draft

    shape = SHAPES[args.shape]
    device = local_device()
    work = Path(tempfile.mkdtemp(prefix="specrl-gpu-draft-"))
    print(f"device {device}, torch {torch.__version__}, shape {args.shape}", flush=True)
    ph = Phases(device)
    model = ph.run("build and save the target", build_target, shape, work / "target", device)
    params = sum(p.numel() for p in model.parameters())
    rollouts = ph.run("sample 96 rollouts (generate)", sample, model, 96, 64, 48, shape["vocab_size"], 1)
    cfg = DraftInitConfig(
        target=str(work / "target"), out=str(work / "draft"), prompts=96, max_tokens=48,
        steps=30, batch_size=16, holdout=16, ttt_steps=3, lr=1e-3, draft_vocab_size=args.draft_vocab,
    )  # fmt: skip
    steps = []
    record = ph.run(
        "draft init fit (load target, capture, 30 TTT steps, held-out eval, save)",
        fit_draft, cfg, rollouts, shape["eos_token_id"], lambda phase, done, total: steps.append(done),
    )  # fmt: skip
    online = ph.run(
        "online: load_head + 8 top-k captured batches",
        online_steps, model, work / "draft", work / "target", rollouts, batches=8, per_batch=8, topk=64,
    )  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": args.shape,
        "target_params": params,
        "draft_params": sum(v.numel() for v in load_file(str(work / "draft" / "model.safetensors")).values()),
        "phases": ph.rows,
        "draft_init": {k: record[k] for k in (
            "aux_layer_ids", "draft_vocab_size", "rollouts", "heldout_rollouts", "steps", "last_loss",
            "heldout_agreement_before",
            "heldout_agreement_after", "acceptance_estimate_before", "acceptance_estimate_after", "seconds",
        )},
        "online": online,
    }  # fmt: skip
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
