"""Forward cost of a Qwen3-8B-shaped target and an EAGLE-3-shaped draft layer on one GPU,
across batch size x tokens per sequence, for the simulator's GPU constants (issue 34).

Why: verifying k drafts costs a forward of k+1 tokens per sequence; whether that stays
as cheap as one token (memory-bound decode) or grows with the tokens (compute-bound) at
the batch sizes of a rollout decides which k pays. Measured here, not assumed.

What runs: random weights in bf16, transformers' Qwen3 (eager PyTorch with SDPA, no CUDA
graphs: slower per step than vLLM, so these are upper bounds on vLLM's cost), a KV cache
of `--context` tokens per sequence filled once per batch size, then a forward of T new
tokens per sequence on it (the cache cut back after each), timed with CUDA events,
median of `--repeats`. The draft is one Qwen3 decoder layer at the target's width with a
32k-token output layer and the 3H -> H input projection, the shape of an EAGLE-3 head
for Qwen3-8B, timed the same way (one draft position per forward).

    python3 scripts/gpu_forward_cost.py --out gpu_forward_cost.json   (on the GPU machine)
    python scripts/gpu_forward_cost.py --tiny                          (a CPU smoke run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

QWEN3_8B = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    tie_word_embeddings=False,
)  # fmt: skip
TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False,
)  # fmt: skip
DRAFT_VOCAB = 32000


def _timer(device: torch.device):
    """A callable timing `fn()` in milliseconds on `device` (CUDA events on a GPU)."""

    def run(fn) -> float:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000

    return run


@torch.inference_mode()
def measure(
    model, *, name: str, batches, tokens, context: int, repeats: int, device, extra=None
) -> list[dict]:
    timer, rows = _timer(device), []
    vocab = model.config.vocab_size
    for b in batches:
        cache = DynamicCache()
        prompt = torch.randint(0, vocab, (b, context), device=device)
        model.model(input_ids=prompt, past_key_values=cache, use_cache=True)  # fill the cache, no logits
        for t in tokens:
            new = torch.randint(0, vocab, (b, t), device=device)

            def step(new=new, cache=cache, b=b, t=t):
                model(input_ids=new, past_key_values=cache, use_cache=True, logits_to_keep=t)
                if extra is not None:
                    extra(b, t)
                cache.crop(context)

            for _ in range(2):
                step()
            times = [timer(step) for _ in range(repeats)]
            rows.append(
                {"model": name, "batch": b, "tokens": t, "context": context,
                 "ms_median": round(statistics.median(times), 4), "ms_min": round(min(times), 4)}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model on CPU (smoke run)")
    ap.add_argument("--batches", default="1,4,16,64,128")
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    shape = TINY if args.tiny else QWEN3_8B
    batches = [int(x) for x in args.batches.split(",")]
    tokens = [int(x) for x in args.tokens.split(",")]
    context = 32 if args.tiny else args.context
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with device:
        target = Qwen3ForCausalLM(Qwen3Config(**shape)).eval()
        draft_cfg = Qwen3Config(**{**shape, "num_hidden_layers": 1, "vocab_size": DRAFT_VOCAB})
        draft = Qwen3ForCausalLM(draft_cfg).eval()
        fc = torch.nn.Linear(3 * shape["hidden_size"], shape["hidden_size"], bias=False)
    aux = {}

    def project(b: int, t: int) -> None:  # EAGLE-3's fc over the three aux hidden states
        if b not in aux:
            aux[b] = torch.randn(b, 1, 3 * shape["hidden_size"], device=device)
        fc(aux[b])

    name = "tiny" if args.tiny else "qwen3-8b"
    common = dict(batches=batches, context=context, repeats=args.repeats, device=device)
    rows = measure(target, name=name, tokens=tokens, **common)
    rows += measure(draft, name=f"eagle3-head-{name}", tokens=[1], extra=project, **common)
    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "shape": "tiny" if args.tiny else "qwen3-8b",
        "command": " ".join(["python3 scripts/gpu_forward_cost.py", *sys.argv[1:]]),
        "rows": rows,
    }  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
