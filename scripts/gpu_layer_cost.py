"""The GPU-bound part of a Qwen3-8B-shaped forward (its matrix products and attention over
a KV cache), replayed as one CUDA graph, across batch size x tokens per sequence: the
cost a well-built engine (vLLM with CUDA graphs) approaches, without framework overhead.
scripts/gpu_forward_cost.py measures the same shapes through transformers' eager model,
which is dominated by kernel launches at small batches.

Per layer: x @ W_qkv (GQA: 32 query, 8 KV heads of 128), the new keys and values written
into the cache in place, SDPA of the T new queries over `--context` cached keys plus the
new ones (each KV head's 4 query heads as one attention), @ W_o, the gated MLP (12288), RMS norms
omitted (negligible); 36 layers with their own weights and KV caches, then the output
layer on every new token (verification needs each position's logits). The EAGLE-3-shaped
draft step: the 3H -> H projection, one such layer, a 32k output layer, T = 1.

    python3 scripts/gpu_layer_cost.py --out gpu_layer_qwen3_8b.json   (on the GPU machine)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

H, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB, DRAFT_VOCAB = 4096, 32, 8, 128, 12288, 36, 151936, 32000
MAX_NEW = 8  # most new tokens per sequence measured (k = 7)


def _layer(device: torch.device, batch: int, context: int) -> dict[str, torch.Tensor]:
    w = lambda *shape: torch.randn(*shape, device=device) * 0.02  # noqa: E731
    return {
        "qkv": w(H, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
        "o": w(HEADS * HEAD_DIM, H),
        "gate_up": w(H, 2 * FFN),
        "down": w(FFN, H),
        # the cache with room for the new tokens, written in place as an engine does
        "k": w(batch, KV_HEADS, context + MAX_NEW, HEAD_DIM),
        "v": w(batch, KV_HEADS, context + MAX_NEW, HEAD_DIM),
    }


def _run_layer(
    x: torch.Tensor, p: dict[str, torch.Tensor], batch: int, tokens: int, context: int
) -> torch.Tensor:
    qkv = x @ p["qkv"]
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    p["k"][:, :, context : context + tokens] = k.view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
    p["v"][:, :, context : context + tokens] = v.view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
    # GQA as one attention per KV head: its 4 query heads' T queries side by side (no mask:
    # the cost of causal masking among <= 8 new tokens is negligible)
    group = HEADS // KV_HEADS
    q = q.view(batch, tokens, KV_HEADS, group, HEAD_DIM).permute(0, 2, 1, 3, 4)
    q = q.reshape(batch, KV_HEADS, tokens * group, HEAD_DIM)
    end = context + tokens
    a = F.scaled_dot_product_attention(q, p["k"][:, :, :end], p["v"][:, :, :end])
    a = a.view(batch, KV_HEADS, tokens, group, HEAD_DIM).permute(0, 2, 1, 3, 4)
    x = x + a.reshape(batch * tokens, HEADS * HEAD_DIM) @ p["o"]
    gate, up = (x @ p["gate_up"]).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ p["down"]


def _graph_ms(fn, repeats: int) -> list[float]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times[2:]


def _row(model: str, batch: int, tokens: int, context: int, times: list[float]) -> dict:
    row = {"model": model, "batch": batch, "tokens": tokens, "context": context,
           "ms_median": round(statistics.median(times), 4), "ms_min": round(min(times), 4)}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,16,64,128")
    ap.add_argument("--tokens", default="1,2,4,8", help=f"at most {MAX_NEW}")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cuda")
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    head = torch.randn(H, VOCAB, device=device) * 0.02
    draft_head = torch.randn(H, DRAFT_VOCAB, device=device) * 0.02
    fc = torch.randn(3 * H, H, device=device) * 0.02
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        layers = [_layer(device, b, args.context) for _ in range(LAYERS)]
        for t in (int(x) for x in args.tokens.split(",")):
            x0 = torch.randn(b * t, H, device=device)

            def target(x0=x0, layers=layers, b=b, t=t):
                x = x0
                for p in layers:
                    x = _run_layer(x, p, b, t, args.context)
                return x @ head

            times = _graph_ms(target, args.repeats)
            rows.append(_row("qwen3-8b", b, t, args.context, times))
        aux = torch.randn(b, 3 * H, device=device)

        def draft(aux=aux, p=layers[0], b=b):
            return _run_layer(aux @ fc, p, b, 1, args.context) @ draft_head

        times = _graph_ms(draft, args.repeats)
        rows.append(_row("eagle3-head-qwen3-8b", b, 1, args.context, times))
        del layers
        torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "what": "matrix products + SDPA of a Qwen3-8B-shaped forward, one CUDA graph (no norms, no rotary)",
        "command": " ".join(["python3 scripts/gpu_layer_cost.py", *sys.argv[1:]]),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
