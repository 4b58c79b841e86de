"""Engine cycle time of a plain AR vLLM engine vs a speculative one held at k=0, with its
drafter running (vLLM's k=0) and paused (specrl's, when k=0 at every batch size),
measured the way the adaptive k controller measures steps (vllm_steps.step_logger: the
engine's time from one output to the next), `--batch` sequences at a time on the zoo
target (the median over steps at that batch size).

Why: the controller's AR baseline is its own engine at k=0; this measures how far that
is from an AR server (docs/benchmarks.md).

    .venv/bin/python scripts/engine_cycle.py [--draft zoo:eagle3-generic] [--repeats 2] [--batch 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from specrl.config import EngineConfig, SpeculationConfig
from specrl.rollout.engines.vllm_control import METHOD
from specrl.rollout.engines.vllm_engine import engine_args
from specrl.rollout.engines.vllm_steps import step_logger
from specrl.zoo import task


async def median_cycle_ms(
    spec: SpeculationConfig, prompts: list[str], *, pause: bool = False, batch: int = 1
) -> float:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args(EngineConfig(dtype="float32"), spec)
    args.enable_logging_iteration_details, args.disable_log_stats = True, True
    steps: list = []
    llm = AsyncLLM.from_engine_args(args, stat_loggers=[step_logger([steps.append])])
    try:
        if spec.enabled:
            await llm.engine_core.call_utility_async(METHOD, [[1, EngineConfig().max_num_seqs, 0]])
            await llm.collective_rpc("specrl_pause_drafter", args=(pause,))
        tokenizer = AutoTokenizer.from_pretrained(args.model)

        async def run(i: int, prompt: str) -> None:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            params = SamplingParams(max_tokens=48, ignore_eos=True, seed=i)
            async for _ in llm.generate({"prompt_token_ids": ids}, params, f"r{i}"):
                pass

        for first in range(0, len(prompts), batch):
            await asyncio.gather(*(run(first + j, p) for j, p in enumerate(prompts[first : first + batch])))
    finally:
        llm.shutdown()
    return 1000 * statistics.median(s.seconds for s in steps if s.batch == batch)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="zoo:eagle3-generic")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    opts = parser.parse_args()
    count = max(8, 2 * opts.batch)
    prompts = [p.prompt for p in task.take(count, seed=21, split="test", max_operand=20, max_terms=3)]
    ar = SpeculationConfig()
    k0 = SpeculationConfig(method="eagle3", draft=opts.draft, adaptive={"enabled": True})
    out: dict[str, list[float]] = {"ar_ms": [], "eagle3_k0_ms": [], "eagle3_k0_paused_ms": []}
    for _ in range(opts.repeats):  # alternated: drift falls on all
        for key, spec, pause in (
            ("ar_ms", ar, False),
            ("eagle3_k0_ms", k0, False),
            ("eagle3_k0_paused_ms", k0, True),
        ):
            ms = await median_cycle_ms(spec, prompts, pause=pause, batch=opts.batch)
            out[key].append(round(ms, 2))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
