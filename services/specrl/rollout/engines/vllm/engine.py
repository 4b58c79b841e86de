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
import threading
import time
from collections.abc import AsyncIterator, Callable

from specrl.config import RolloutServerConfig, SpeculationConfig, VllmEngineConfig, resolve_model_path
from specrl.rollout.engines.base import (
    Acceptance,
    EngineInfo,
    EngineStep,
    FinishReason,
    GeneratedSample,
    Sampling,
    SelfTestResult,
)
from specrl.rollout.engines.vllm import check_version
from specrl.rollout.engines.vllm.history import PROPOSER as HISTORY_PROPOSER
from specrl.rollout.engines.vllm.steps import step_logger
from specrl.rollout.engines.vllm.worker import SpecrlWorkerExtension
from specrl.rollout.history import suffix_tree_class
from specrl.weightsync.group import JoinInfo

log = logging.getLogger("specrl.rollout.vllm")

# vLLM imports the extension in each worker by its dotted path: taken from the class, so
# that it follows the class wherever it moves
WORKER_EXTENSION = f"{SpecrlWorkerExtension.__module__}.{SpecrlWorkerExtension.__qualname__}"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def speculative_config(spec: SpeculationConfig, max_num_seqs: int) -> dict | None:
    """vLLM's `speculative_config` for a specrl speculation config (None when off). An
    adaptive engine starts with a schedule (the full k everywhere unless one is given):
    without one, vLLM cannot change k at runtime."""
    if not spec.enabled:
        return None
    # the hybrid's history may draft past the draft model's k (history.hybrid_max_draft)
    cfg: dict = {"method": spec.method, "num_speculative_tokens": spec.engine_k}
    if spec.method == "ngram":
        cfg["prompt_lookup_min"] = spec.prompt_lookup_min
        cfg["prompt_lookup_max"] = spec.prompt_lookup_max
    elif spec.method == "history":  # specrl's proposer, through vLLM's extension point
        cfg |= {"method": "custom_class", "model": HISTORY_PROPOSER}
    else:
        cfg["model"] = resolve_model_path(spec.draft or "")
    if spec.history.hybrid:  # drafts made after bookkeeping, from the CPU's tokens (history.py)
        cfg["disable_padded_drafter_batch"] = True
    schedule = spec.k_schedule
    if schedule is None and spec.adaptive.enabled:
        schedule = ((1, max_num_seqs, spec.num_speculative_tokens),)
    if schedule is not None:
        cfg["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in schedule]
    return cfg


def engine_args(engine: VllmEngineConfig, speculation: SpeculationConfig, *, node_rank: int = 0):
    """vLLM's AsyncEngineArgs for node `node_rank` of the engine: the same on every node
    of a multi-node replica but for the rank."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    model = resolve_model_path(engine.model)
    spec = speculative_config(speculation, engine.max_num_seqs)
    # read by the engine processes started from these arguments
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = engine.cpu_threads_bind
    nodes = {}
    if engine.nnodes > 1:
        nodes = {"nnodes": engine.nnodes, "node_rank": node_rank, "master_addr": engine.leader}
        nodes |= {"master_port": engine.master_port, "distributed_executor_backend": "mp"}
    return AsyncEngineArgs(
        model=model,
        tokenizer=model,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_memory_bytes=(int(engine.kv_cache_gib * 2**30) if engine.kv_cache_gib is not None else None),
        dtype=engine.dtype,
        enforce_eager=engine.enforce_eager,
        enable_prefix_caching=engine.enable_prefix_caching,
        seed=engine.seed,
        tensor_parallel_size=engine.tensor_parallel_size,
        speculative_config=spec,
        logprobs_mode="processed_logprobs",
        per_request_spec_decode_metrics="summary" if spec else "none",
        worker_extension_cls=WORKER_EXTENSION,
        # the adaptive controller's input: every step's batch composition (steps.py);
        # vLLM's own stat loggers (a log line per step with this on) are replaced by specrl's
        enable_logging_iteration_details=speculation.adaptive.enabled,
        disable_log_stats=speculation.adaptive.enabled,
        **nodes,
    )


def serve_worker_node(cfg: RolloutServerConfig, node_rank: int) -> None:
    """Node `node_rank` (> 0) of a multi-node engine: its share of the workers, driven
    by node 0's engine (`specrl serve rollout` with the same `cfg`) until that goes away.
    Weight updates reach these workers as they reach node 0's, through the engine's
    collective RPC."""
    engine = cfg.engine
    import vllm
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    if not 0 < node_rank < engine.nnodes:
        raise ValueError(f"node rank {node_rank}: worker nodes are 1..{engine.nnodes - 1} (engine.nnodes)")
    check_version(vllm.__version__)
    args = engine_args(engine, cfg.speculation, node_rank=node_rank)
    config = args.create_engine_config(usage_context=UsageContext.ENGINE_CONTEXT, headless=True)
    log.info(
        "worker node %d of %d; node 0 at %s:%d", node_rank, engine.nnodes, engine.leader, engine.master_port
    )
    executor = MultiprocExecutor(config, monitor_workers=False)
    leader = f"{engine.leader}:{cfg.port}"
    follow = {"grace_s": engine.leader_grace_s, "every_s": min(5.0, engine.leader_grace_s)}
    threading.Thread(target=_follow_leader, args=(leader, executor), kwargs=follow, daemon=True).start()
    executor.start_worker_monitor(inline=True)  # returns when the workers exit


def _follow_leader(address: str, executor, *, every_s: float, grace_s: float) -> None:
    """Stop this node's workers once node 0 has served and then stopped answering for
    `grace_s` (engine.leader_grace_s): without it they would wait on it forever."""
    from specrl.serving import health_of

    seen, gone_since = False, None
    while True:
        time.sleep(every_s)
        up = health_of(address, timeout=every_s) in ("SERVING", "NOT_SERVING")
        seen |= up
        if up or not seen:
            gone_since = None
            continue
        gone_since = gone_since or time.monotonic()
        if time.monotonic() - gone_since > grace_s:
            log.error("node 0 (%s) is gone: stopping this node's workers", address)
            executor.shutdown()
            return


class VllmEngine:
    """Owns one AsyncLLM (and its engine-core process)."""

    def __init__(self, engine: VllmEngineConfig, speculation: SpeculationConfig) -> None:
        import vllm

        check_version(vllm.__version__)
        import vllm.envs
        from transformers import AutoConfig, AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        model = resolve_model_path(engine.model)
        spec = speculative_config(speculation, engine.max_num_seqs)
        args = engine_args(engine, speculation)
        self._tokenizer = AutoTokenizer.from_pretrained(model)
        hf = AutoConfig.from_pretrained(model)
        self.info = EngineInfo(
            engine=engine.kind,
            engine_version=vllm.__version__,
            model=model,
            method=speculation.method,
            k=speculation.k,
            draft=(spec or {}).get("model", ""),
            max_model_len=engine.max_model_len,
            vocab_size=hf.vocab_size,
            workers=engine.tensor_parallel_size,
            max_n=vllm.envs.VLLM_MAX_N_SEQUENCES,
        )
        self.tokens_generated = 0
        self._step_listeners: list[Callable[[EngineStep], None]] = []
        self._drafter_paused = False
        loggers = [step_logger(self._step_listeners)] if speculation.adaptive.enabled else None
        if speculation.drafts_from_history:
            suffix_tree_class()  # the native index, or a clear error before the engine starts
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        self._history = speculation.history if speculation.drafts_from_history else None
        self._model_k = speculation.num_speculative_tokens  # the hybrid's draft model's

    async def start(self) -> None:
        """After the engine starts: drafting from history gets the model runner it reads
        requests from, and its settings."""
        if self._history is None:
            return
        h = self._history
        hybrid = None
        if h.hybrid:  # install_hybrid's settings
            hybrid = {
                "min_draft": h.hybrid_min_draft,
                "min_match": h.hybrid_min_match,
                "leave_out_after": h.hybrid_leave_out_after,
                "idle_share": h.hybrid_idle_share,
                "extend": h.hybrid_extend,
                "model_k": self._model_k,
            }
        args = (h.index_settings(), hybrid)
        if not all(await self._llm.collective_rpc("specrl_attach_history", args=args)):
            raise RuntimeError("the engine's drafter cannot draft from history (speculation.history)")

    async def seed_history(self, prompt: list[int], responses: list[list[int]]) -> None:
        if self._history is not None:
            await self._llm.collective_rpc("specrl_seed_history", args=(prompt, responses))

    async def history_state(self) -> dict[str, int]:
        """The first worker's (each drafts the same batch and keeps the same history)."""
        if self._history is None:
            return {}
        return (await self._llm.collective_rpc("specrl_history_state"))[0]

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
            stop_token_ids=list(sampling.stop_token_ids) or None,
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
                self.tokens_generated += len(c.token_ids)
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
            "load_seconds": max(r.get("load_seconds", 0.0) for r in results),
            "wait_seconds": max(r.get("wait_seconds", 0.0) for r in results),
            "error": "; ".join(r["error"] for r in failed),
        }

    async def reset_prefix_cache(self) -> bool:
        return bool(await self._llm.reset_prefix_cache())

    async def set_k_schedule(self, schedule: list[tuple[int, int, int]]) -> bool:
        """The drafter is resumed before any k > 0 can be scheduled and paused only once
        no batch size drafts (control.py), so no step drafts with a paused drafter.
        On resume the draft KV written while paused is missing, for running requests and
        for prompt blocks cached meanwhile: the prefix cache is reset with the running
        requests preempted, so vLLM recomputes them (target and drafter) before they
        continue. That costs one prefill of what is in flight, once per resume."""
        from specrl.rollout.engines.vllm.control import METHOD

        pause = all(k == 0 for _, _, k in schedule)
        if not pause and self._drafter_paused:
            await self._llm.collective_rpc("specrl_pause_drafter", args=(False,))
            await self._llm.reset_prefix_cache(reset_running_requests=True)
            self._drafter_paused = False
        await self._llm.engine_core.call_utility_async(METHOD, [list(e) for e in schedule])
        if pause and not self._drafter_paused:
            self._drafter_paused = all(await self._llm.collective_rpc("specrl_pause_drafter", args=(True,)))
        return self._drafter_paused

    def watch_steps(self, listener: Callable[[EngineStep], None]) -> None:
        self._step_listeners.append(listener)

    def shutdown(self) -> None:
        self._llm.shutdown()
