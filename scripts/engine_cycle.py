"""Engine cycle time of a plain AR vLLM engine vs a speculative one held at k=0, with its
drafter running (vLLM's k=0) and paused (specrl's, when k=0 at every batch size),
measured the way the adaptive k controller measures steps (engines/vllm/steps.py: the
engine's time from one output to the next), `--batch` sequences at a time on the zoo
target (the median over steps at that batch size).

Why: the controller's AR baseline is its own engine at k=0; this measures how far that
is from an AR server (docs/draft.md, "Measurements behind the controller"). Engines
started one after another differ by this machine's drift; `--fetch-ab` instead
alternates, inside one paused engine, the engine core's per-step fetch of draft tokens
from the worker (which specrl turns off at k=0 everywhere, engines/vllm/control.py) on
and off.

    .venv/bin/python scripts/engine_cycle.py [--draft zoo:eagle3-generic] [--repeats 2] [--batch 1]
                                             [--fetch-ab]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from specrl.config import SpeculationConfig, VllmEngineConfig
from specrl.data import task
from specrl.rollout.engines.vllm.control import METHOD
from specrl.rollout.engines.vllm.engine import engine_args
from specrl.rollout.engines.vllm.steps import step_logger
from specrl.zoo.build import ZooSpec, task_kwargs

FETCH = "specrl_bench_draft_fetch"  # this script's own engine-core utility (--fetch-ab)
ZOO_TASK = task_kwargs(ZooSpec())  # the task the zoo target was trained on


class Engine:
    """An AsyncLLM with the controller's step signal, `batch` prompts decoded together."""

    def __init__(self, spec: SpeculationConfig, *, pause: bool) -> None:
        self.spec, self.pause = spec, pause
        self.steps: list = []

    async def __aenter__(self) -> Engine:
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(VllmEngineConfig(dtype="float32"), self.spec)
        args.enable_logging_iteration_details, args.disable_log_stats = True, True
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[step_logger([self.steps.append])])
        if self.spec.enabled:
            await self.llm.engine_core.call_utility_async(METHOD, [[1, VllmEngineConfig().max_num_seqs, 0]])
            await self.llm.collective_rpc("specrl_pause_drafter", args=(self.pause,))
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        self.requests = 0
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.llm.shutdown()

    async def median_cycle_ms(self, prompts: list[str], batch: int) -> float:
        from vllm import SamplingParams

        async def run(prompt: str) -> None:
            self.requests += 1
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            params = SamplingParams(max_tokens=48, ignore_eos=True, seed=self.requests)
            async for _ in self.llm.generate({"prompt_token_ids": ids}, params, f"r{self.requests}"):
                pass

        self.steps.clear()
        for first in range(0, len(prompts), batch):
            await asyncio.gather(*(run(p) for p in prompts[first : first + batch]))
        return 1000 * statistics.median(s.seconds for s in self.steps if s.batch == batch)


async def engines_side_by_side(draft: str, prompts: list[str], batch: int, repeats: int) -> dict:
    ar = SpeculationConfig()
    k0 = SpeculationConfig(method="eagle3", draft=draft, adaptive={"enabled": True})
    out: dict[str, list[float]] = {"ar_ms": [], "eagle3_k0_ms": [], "eagle3_k0_paused_ms": []}
    for _ in range(repeats):  # alternated: drift falls on all
        for key, spec, pause in (
            ("ar_ms", ar, False),
            ("eagle3_k0_ms", k0, False),
            ("eagle3_k0_paused_ms", k0, True),
        ):
            async with Engine(spec, pause=pause) as engine:
                out[key].append(round(await engine.median_cycle_ms(prompts, batch), 2))
    return out


async def draft_fetch_ab(draft: str, prompts: list[str], batch: int, repeats: int) -> dict:
    from vllm.v1.engine.core import EngineCore

    # the engine core process is forked from this one and inherits the method
    setattr(EngineCore, FETCH, lambda core, on: setattr(core, "check_for_draft_tokens", on))
    out: dict[str, list[float]] = {"fetch_on_ms": [], "fetch_off_ms": []}
    spec = SpeculationConfig(method="eagle3", draft=draft, adaptive={"enabled": True})
    async with Engine(spec, pause=True) as engine:
        for r in range(repeats):
            for on in (True, False) if r % 2 else (False, True):  # order alternated
                await engine.llm.engine_core.call_utility_async(FETCH, on)
                out["fetch_on_ms" if on else "fetch_off_ms"].append(
                    round(await engine.median_cycle_ms(prompts, batch), 2)
                )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="zoo:eagle3-generic")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    parser.add_argument("--fetch-ab", action="store_true", help="the draft fetch on/off in one paused engine")
    opts = parser.parse_args()
    count = max(8, 4 * opts.batch if opts.fetch_ab else 2 * opts.batch)
    prompts = [p.prompt for p in task.take(count, seed=21, split="test", **ZOO_TASK)]
    measure = draft_fetch_ab if opts.fetch_ab else engines_side_by_side
    print(json.dumps(await measure(opts.draft, prompts, opts.batch, opts.repeats)))


if __name__ == "__main__":
    asyncio.run(main())
