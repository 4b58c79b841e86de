"""vLLM backend of the rollout server: one `AsyncLLM` serving many requests with
continuous batching, speculative decoding configured once per engine.

Engine settings that RL correctness depends on are fixed here, not left to callers:
  - logprobs_mode="processed_logprobs": log-probs after temperature / top-k / top-p, the
    distribution the sampler actually drew from (vLLM's default is before temperature);
  - per-request spec-decode metrics, so every sample carries its own acceptance counts;
  - specrl's worker extension (sampler self-test, weight-sync receiver) and, through the
    `vllm.general_plugins` entry point, specrl's engine fixes in every engine process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator

from specrl.config import EngineConfig, SpeculationConfig, resolve_model_path
from specrl.rollout.engines.base import (
    Acceptance,
    EngineInfo,
    FinishReason,
    GeneratedSample,
    Sampling,
    SelfTestResult,
)
from specrl.weightsync.group import JoinInfo

log = logging.getLogger("specrl.rollout.vllm")

WORKER_EXTENSION = "specrl.rollout.engines.vllm_worker.SpecrlWorkerExtension"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def speculative_config(spec: SpeculationConfig) -> dict | None:
    """vLLM's `speculative_config` for a specrl speculation config (None when off)."""
    if not spec.enabled:
        return None
    cfg: dict = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "ngram":
        cfg["prompt_lookup_min"] = spec.prompt_lookup_min
        cfg["prompt_lookup_max"] = spec.prompt_lookup_max
    else:
        cfg["model"] = resolve_model_path(spec.draft or "")
    if spec.k_schedule is not None:
        cfg["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in spec.k_schedule]
    return cfg


class VllmEngine:
    """Owns one AsyncLLM (and its engine-core process)."""

    def __init__(self, engine: EngineConfig, speculation: SpeculationConfig) -> None:
        import vllm
        from transformers import AutoConfig, AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        model = resolve_model_path(engine.model)
        spec = speculative_config(speculation)
        # read by the engine-core process this constructor starts
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = engine.cpu_threads_bind
        args = AsyncEngineArgs(
            model=model,
            tokenizer=model,
            max_model_len=engine.max_model_len,
            max_num_seqs=engine.max_num_seqs,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            kv_cache_memory_bytes=(
                int(engine.kv_cache_gib * 2**30) if engine.kv_cache_gib is not None else None
            ),
            dtype=engine.dtype,
            enforce_eager=engine.enforce_eager,
            enable_prefix_caching=engine.enable_prefix_caching,
            seed=engine.seed,
            tensor_parallel_size=engine.tensor_parallel_size,
            speculative_config=spec,
            logprobs_mode="processed_logprobs",
            per_request_spec_decode_metrics="summary" if spec else "none",
            worker_extension_cls=WORKER_EXTENSION,
        )
        self._tokenizer = AutoTokenizer.from_pretrained(model)
        hf = AutoConfig.from_pretrained(model)
        self.info = EngineInfo(
            engine="vllm",
            engine_version=vllm.__version__,
            model=model,
            method=speculation.method,
            k=speculation.k,
            draft=(spec or {}).get("model", ""),
            max_model_len=engine.max_model_len,
            vocab_size=hf.vocab_size,
            workers=engine.tensor_parallel_size,
        )
        self._llm = AsyncLLM.from_engine_args(args)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=False)["input_ids"]

    async def generate(
        self, prompt_token_ids: list[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[GeneratedSample]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
        )
        tokens: dict[int, list[int]] = {}
        logprobs: dict[int, list[float]] = {}
        texts: dict[int, list[str]] = {}
        prompt = {"prompt_token_ids": prompt_token_ids}
        async for out in self._llm.generate(prompt, params, request_id):
            for c in out.outputs:
                toks = tokens.setdefault(c.index, [])
                toks.extend(c.token_ids)
                lps = logprobs.setdefault(c.index, [])
                lps.extend(pos[t].logprob for pos, t in zip(c.logprobs or [], c.token_ids))
                texts.setdefault(c.index, []).append(c.text)
                if c.finish_reason is None:
                    continue
                m = c.spec_decode_metrics
                yield GeneratedSample(
                    sample_index=c.index,
                    token_ids=toks,
                    logprobs=lps,
                    text="".join(texts[c.index]),
                    finish_reason=_FINISH.get(c.finish_reason, "stop"),
                    prompt_tokens=len(prompt_token_ids),
                    acceptance=(
                        Acceptance.from_histogram(m.histogram, m.num_draft_tokens)
                        if m is not None
                        else Acceptance()
                    ),
                )

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def sampler_self_test(self, *, trials: int, alpha: float, seed: int) -> SelfTestResult:
        results = await self._llm.collective_rpc("specrl_sampler_self_test", args=(trials, alpha, seed))
        passed = all(r["passed"] for r in results)
        p_value = min(r["p_value"] for r in results)
        return SelfTestResult(passed, p_value, " | ".join(r["detail"] for r in results))

    async def applied_patches(self) -> list[str]:
        """specrl fixes active in the engine's worker process(es)."""
        results = await self._llm.collective_rpc("specrl_applied_patches")
        return sorted(set().union(*results))

    async def join_weight_group(self, info: JoinInfo) -> list[int]:
        # plain data across the engine-core boundary (its serializer turns dataclasses into dicts)
        args = (dataclasses.asdict(info),)
        return list(await self._llm.collective_rpc("specrl_join_weight_group", args=args))

    async def receive_weights(self, kind: str, epoch: int, manifest: dict) -> dict:
        try:
            results = await self._llm.collective_rpc("specrl_receive_weights", args=(kind, epoch, manifest))
        except Exception as e:  # the engine itself failed; its weights are unknown
            return {"ok": False, "buckets": -1, "error": f"{type(e).__name__}: {e}"}
        failed = [r for r in results if not r["ok"]]
        return {
            "ok": not failed,
            "buckets": min(r["buckets"] for r in results),
            "bytes": results[0].get("bytes", 0),
            "seconds": max(r["seconds"] for r in results),
            "error": "; ".join(r["error"] for r in failed),
        }

    async def reset_prefix_cache(self) -> bool:
        return bool(await self._llm.reset_prefix_cache())

    async def set_k_schedule(self, schedule: list[tuple[int, int, int]]) -> None:
        from specrl.rollout.engines.vllm_control import METHOD

        await self._llm.engine_core.call_utility_async(METHOD, [list(e) for e in schedule])

    def shutdown(self) -> None:
        self._llm.shutdown()
