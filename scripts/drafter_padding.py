"""EAGLE-3 alone with vLLM's padded drafter batch (its default) and unpadded
(`disable_padded_drafter_batch`, which the hybrid with history needs: it drafts after
vLLM's bookkeeping, from the tokens on the CPU, and turns async scheduling off), both
engines up at once, `--concurrency` sequences decoded together, rounds alternated; prints
tokens per second per round and the unpadded / padded ratio (geometric mean of the
per-round ratios, 95% interval).

Why: the hybrid measured slower than EAGLE-3 alone at large batches (docs/benchmarks.md,
"History drafting over the epochs of an RL run"); this separates what the unpadded path
costs EAGLE-3 itself from what the hybrid adds (docs/draft.md, "What it costs").

    .venv/bin/python scripts/drafter_padding.py [--concurrency 4,64] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from specrl.bench.adaptive import paired_ratio
from specrl.config import SpeculationConfig, VllmEngineConfig
from specrl.data import task
from specrl.rollout.engines.vllm.engine import engine_args
from specrl.zoo.build import ZooSpec, task_kwargs

ZOO_TASK = task_kwargs(ZooSpec())  # the task the zoo target was trained on
TOKENS = 48  # per sequence (RL-Zero's max_tokens in the bench)


async def tokens_per_s(llm, tokenizer, prompts: list[str], seed: int) -> float:
    from vllm import SamplingParams

    async def run(i: int, prompt: str) -> int:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=seed + i)
        outputs = [out async for out in llm.generate({"prompt_token_ids": ids}, params, f"s{seed}-{i}")]
        return len(outputs[-1].outputs[0].token_ids)

    started = time.perf_counter()
    tokens = await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
    return sum(tokens) / (time.perf_counter() - started)


async def main() -> None:
    from transformers import AutoTokenizer
    from vllm.v1.engine.async_llm import AsyncLLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="zoo:eagle3-domain")
    parser.add_argument("--concurrency", default="4,64", help="comma-separated sequences in flight")
    parser.add_argument("--rounds", type=int, default=4)
    opts = parser.parse_args()
    levels = [int(c) for c in opts.concurrency.split(",")]
    spec = SpeculationConfig(method="eagle3", draft=opts.draft)
    engines = {}
    for name in ("padded", "unpadded"):
        args = engine_args(VllmEngineConfig(dtype="float32", kv_cache_gib=0.25), spec)
        args.speculative_config["disable_padded_drafter_batch"] = name == "unpadded"
        engines[name] = AsyncLLM.from_engine_args(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [p.prompt for p in task.take(max(levels), seed=21, split="test", **ZOO_TASK)]
    rates: dict[str, dict[int, list[float]]] = {name: {c: [] for c in levels} for name in engines}
    try:
        for r in range(opts.rounds + 1):  # round 0 warms both up, not counted
            for c in levels:
                order = list(engines) if r % 2 else list(reversed(engines))
                for name in order:
                    rate = await tokens_per_s(engines[name], tokenizer, prompts[:c], seed=1000 * r)
                    if r:
                        rates[name][c].append(round(rate, 1))
    finally:  # vLLM's AsyncLLM.__del__ shuts down again: let it run now, not at exit
        while engines:
            engines.popitem()[1].shutdown()
    for c in levels:
        ratio, lo, hi = paired_ratio(rates["unpadded"][c], rates["padded"][c])
        row = {"concurrency": c, **{f"{n}_tokens_per_s": rates[n][c] for n in rates}}
        print(json.dumps(row | {"unpadded_vs_padded": [round(ratio, 3), round(lo, 3), round(hi, 3)]}))


if __name__ == "__main__":
    asyncio.run(main())
