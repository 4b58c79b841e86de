"""specrl's fixes to vLLM (to its sampling on CPU, to its start-up and first-request time
on CPU, and to its CPU GEMMs' kernel builds), applied in every engine process.

vLLM loads `vllm.general_plugins` entry points in the frontend, the engine-core and the
worker processes, so `register` (the entry point in pyproject.toml) is the only hook that
reaches the process where sampling happens; a monkeypatch in the parent does nothing.

Each fix is one named function, linked to its upstream issue, guarded by the engine
version it is known to be needed for, and removable once vLLM ships the fix.

Set SPECRL_VLLM_PATCHES=0 to disable every fix, or to a comma-separated list of fix
names each prefixed with "-" to disable only those (the lossless tests disable
`fix_cpu_expand_batch_to_tokens` alone to show that it is what makes speculative
sampling exact on CPU, keeping the others: start-up time, seeded partial prefills).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal

import torch

from specrl.launcher import parent_death_signal

log = logging.getLogger("specrl.rollout.vllm.patches")

DISABLE_ENV = "SPECRL_VLLM_PATCHES"
START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
_APPLIED: list[str] = []
ORIGINALS: dict[str, object] = {}  # what each fix replaced, for tests and rollback


def _expand_batch_to_tokens(
    x: torch.Tensor,  # [batch_size]
    cu_num_tokens: torch.Tensor,  # [batch_size]
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """Exact torch version of vllm.v1.sample.rejection_sampler.expand_batch_to_tokens:
    x = [a, b, c], cu_num_tokens = [2, 5, 6] -> [a, a, b, b, b, c], with values equal to
    replace_from replaced by replace_to. Keeps x's dtype (floats are not truncated)."""
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1))
    replaced = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    out = torch.repeat_interleave(replaced, counts.to(x.device), output_size=num_tokens)
    return out


def fix_cpu_expand_batch_to_tokens() -> bool:
    """vLLM issue #55005 (fix PR #55006): on CPU without Triton, the C++ fallback behind
    `expand_batch_to_tokens` writes into a temporary int64 copy and never copies back, so
    the per-request temperature / top-k / top-p spread over draft positions is
    uninitialised memory and speculative sampling at temperature > 0 is not lossless.
    Needed where vLLM runs its Triton kernels through the CPU shim; harmless elsewhere
    (the torch version computes the same thing), but only applied where it is needed."""
    import vllm
    from vllm.v1.sample import rejection_sampler

    if not vllm.__version__.startswith("0.32.") or torch.cuda.is_available():
        return False
    ORIGINALS.setdefault("expand_batch_to_tokens", rejection_sampler.expand_batch_to_tokens)
    rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
    return True


def _discarded_cpu_generators(runner) -> dict[int, tuple[torch.Generator, torch.Tensor]]:
    """Seeded requests of this step whose sampled token will be discarded (a partial
    prefill), with their CPU generator's state before sampling."""
    import numpy as np

    generators = runner.input_batch.generators
    out: dict[int, tuple[torch.Generator, torch.Tensor]] = {}
    if not generators:  # unseeded traffic: nothing to save, every step
        return out
    for i in np.nonzero(runner.discard_request_mask.np[: runner.input_batch.num_reqs])[0]:
        gen = generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            out[int(i)] = (gen, gen.get_state())
    return out


def fix_cpu_seeded_partial_prefill() -> bool:
    """vLLM's model runner rewinds a seeded request's generator by 4 Philox offsets when
    it discards the token sampled for a partial (chunked) prefill; a CPU torch.Generator
    has no offset, so the engine core dies ("CPU Generator does not use offset") the
    first time a seeded request's prefill is chunked: a prompt over the token budget, or
    requests recomputed together after a preemption (the drafter resume does that). Not
    filed upstream that we found (vllm-rbln fixed its fork by skipping the rewind). Here
    the CPU generator's state is saved before sampling and restored after, which is what
    the rewind means, and the rewind is skipped for those requests."""
    import vllm
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not vllm.__version__.startswith("0.32.") or torch.cuda.is_available():
        return False
    sample = ORIGINALS.setdefault("GPUModelRunner._sample", GPUModelRunner._sample)
    bookkeeping = ORIGINALS.setdefault("GPUModelRunner._bookkeeping_sync", GPUModelRunner._bookkeeping_sync)

    def _sample(self, *args, **kwargs):
        saved = _discarded_cpu_generators(self)
        out = sample(self, *args, **kwargs)
        for gen, state in saved.values():
            gen.set_state(state)
        self._specrl_restored = saved
        return out

    def _bookkeeping_sync(self, *args, **kwargs):
        generators = self.input_batch.generators
        held = {i: generators.pop(i) for i in getattr(self, "_specrl_restored", {}) if i in generators}
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(held)
            self._specrl_restored = {}

    GPUModelRunner._sample = _sample
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync
    return True


# Logit values up to which ranks are counted eagerly (the zoo's 128-token vocabulary up
# to 2048 rows: 0.3-0.5 ms measured); above it vLLM's compiled kernel, which fuses compare and
# sum: eager measured 13-25x slower there (64 rows of Qwen3's 151936 tokens: 35 vs 1.4 ms).
EAGER_RANK_MAX = 1 << 18


def _count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """vllm.v1.sample.ops.logprobs.batched_count_greater_than (per row of x [N, V], how
    many entries are >= that row's value in values [N, 1]: a token's logprob rank),
    counted eagerly for small logits and by vLLM's compiled kernel for large ones."""
    if x.numel() <= EAGER_RANK_MAX:
        return (x >= values).sum(-1)
    return ORIGINALS["batched_count_greater_than"](x, values)


def fix_cpu_logprob_rank_compile() -> bool:
    """vLLM computes the rank of every returned logprob with a function it compiles with
    torch.compile (inductor), to spare GPU memory; on CPU that compile happens in each
    worker at the first request that asks for logprobs, and every rollout request does:
    the first Generate of each replica took 2.2 s instead of 0.1 s on 2 cores with a warm
    inductor cache (6.4 s for the function alone in a fresh process, more with a cold
    one). Small logits (small vocabularies) are counted eagerly, never compiling; large
    ones still go to the compiled kernel, compiled at their first request as before."""
    import vllm
    from vllm.v1.sample import sampler

    if not vllm.__version__.startswith("0.32.") or torch.cuda.is_available():
        return False
    ORIGINALS.setdefault("batched_count_greater_than", sampler.batched_count_greater_than)
    sampler.batched_count_greater_than = _count_at_least
    return True


# Token counts up to which a CPU GEMM runs at its own count; above, counts are rounded up
# to GEMM_BUCKETS_PER_DOUBLING steps between powers of two (at most 1/8 more rows);
# GEMM_KERNELS kernels kept per weight hold every count to 2**16 tokens (vLLM keeps 32)
GEMM_EXACT_ROWS = 16
GEMM_BUCKETS_PER_DOUBLING = 8
GEMM_KERNELS = 128


def gemm_rows(rows: int) -> int:
    """The token count a CPU GEMM over `rows` tokens runs at (fix_cpu_gemm_token_buckets)."""
    if rows <= GEMM_EXACT_ROWS:
        return rows
    step = (1 << (rows.bit_length() - 1)) // GEMM_BUCKETS_PER_DOUBLING
    return -(-rows // step) * step


def _bucketed_onednn_mm(handler, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """vllm._custom_ops.onednn_mm with x's rows padded with zeros to `gemm_rows` and the
    padding's rows cut from the output (a GEMM's rows do not mix)."""
    rows = x.numel() // handler.k
    padded = gemm_rows(rows)
    if padded == rows or torch.compiler.is_compiling():
        return ORIGINALS["onednn_mm"](handler, x, bias)
    x_padded = x.new_zeros((padded, handler.k))
    x_padded[:rows] = x.reshape(rows, handler.k)
    return ORIGINALS["onednn_mm"](handler, x_padded, bias)[:rows].view(*x.shape[:-1], handler.n)


def fix_cpu_gemm_token_buckets() -> bool:
    """vLLM's CPU linear layers (oneDNN's matmul, `onednn_mm`) build a kernel for each
    token count they meet and keep 32 per weight (`create_onednn_mm(weight, 32)` in
    vllm/model_executor/layers/utils.py): building one costs 0.2-0.5 ms at the zoo's
    shapes, ~20x the GEMM itself (measured). A speculative batch meets more counts than
    that: its rows vary as requests end and start, times k + 1 where it verifies, and a
    batch of uneven drafts (history, n-gram, the hybrid; a drafter pass over the tokens
    just accepted) meets a new count nearly every step (at c=64 on the CPU testbed 88% of
    the history drafter's GEMM calls met their count for the first time, autoregressive
    decoding's 18-19%; logged ad hoc). Counts are rounded up to a few per doubling and
    every bucket's kernel is kept (GEMM_KERNELS), so each is built once; on GPUs vLLM
    pads a batch to its CUDA graph sizes, which does the same there. Paired with the
    engine without it (docs/draft.md, three runs): at c=64 0.92-1.23x the tokens a second
    of EAGLE-3 alone, 1.10-1.16x history's, 1.03-1.33x the hybrid's (three of fourteen
    resolved, all faster); at c=4 alike. Not filed upstream that we found. At Qwen3-8B's
    layer size (4096 x 4096) building is a small part of a GEMM (measured: 24.5 ms a
    GEMM over new counts, 24.2 over buckets), and padding adds at most 1/8 more rows."""
    import vllm
    from vllm import _custom_ops as ops

    if not vllm.__version__.startswith("0.32.") or torch.cuda.is_available() or not ops._supports_onednn:
        return False
    ORIGINALS.setdefault("onednn_mm", ops.onednn_mm)
    create = ORIGINALS.setdefault("create_onednn_mm", ops.create_onednn_mm)
    ops.onednn_mm = _bucketed_onednn_mm  # the layers look it up at each call
    # and create their handlers when their weights are loaded, after this
    ops.create_onednn_mm = lambda weight, kept=GEMM_KERNELS: create(weight, max(kept, GEMM_KERNELS))
    return True


# An engine process (engine core, worker) is SIGKILLed by the kernel when the process
# that started it dies: a rollout server killed outright (a Ray actor's kill takes the
# actor's children, not theirs) must not leave engines behind holding a GPU's memory
# (seen on Ray: the killed replica's engine core and worker lived on, reparented to init).
# The starting thread is each parent's main thread (the server's creates the AsyncLLM, the
# engine core's its workers), which lives as long as the process.
_ENGINE_DIES_WITH_PARENT = parent_death_signal(signal.SIGKILL)


class _EngineProcess(multiprocessing.context.ForkProcess):
    def run(self) -> None:
        if _ENGINE_DIES_WITH_PARENT is not None:
            _ENGINE_DIES_WITH_PARENT()
        super().run()


class _EngineForkContext(multiprocessing.context.ForkContext):
    Process = _EngineProcess


def _fork_context() -> multiprocessing.context.BaseContext:
    return _EngineForkContext()


def _omp_cpus() -> list[int]:
    """The cores vLLM meant for this worker: it hands them to a new process only through
    the OpenMP environment it sets around `Process.start()` (GOMP_CPU_AFFINITY,
    OMP_PLACES or KMP_AFFINITY's proclist, see vllm.utils.ompmultiprocessing)."""
    kmp = re.search(r"proclist=\[([^\]]*)\]", os.environ.get("KMP_AFFINITY", ""))
    spec = kmp.group(1) if kmp else os.environ.get("GOMP_CPU_AFFINITY") or os.environ.get("OMP_PLACES", "")
    return [int(c) for c in re.findall(r"\d+", spec)]


def bind_forked_worker() -> None:
    """What a spawned worker's OpenMP runtime does at start from the environment vLLM set
    for it, done by hand: a forked worker inherits its parent's runtime, already started
    without that environment, so it would run two unbound compute threads where vLLM
    meant one on core 0 (measured: ~30% fewer tokens/s at batch 1 before this)."""
    if cpus := _omp_cpus():
        os.sched_setaffinity(0, cpus)  # threads started from here on inherit it
    if threads := os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))


def fork_cpu_engine_processes() -> bool:
    """vLLM's CPU platform forces the `spawn` start method on every process it starts, so
    the engine-core process and then its worker each re-import torch and vLLM (~10 s each
    on 2 cores) before the model loads: two thirds of a replica's start, which is how
    long a scaled-up generation pod waits before serving. Both are forked instead (no
    CUDA context here; the server creates its engine before any torch work), and each
    forked worker is bound to the cores vLLM chose for it (`bind_forked_worker`). A user
    who sets VLLM_WORKER_MULTIPROC_METHOD keeps their choice."""
    import vllm
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor import multiproc_executor

    user_choice = os.environ.get(START_METHOD_ENV)
    if not vllm.__version__.startswith("0.32.") or torch.cuda.is_available() or user_choice:
        return False
    ORIGINALS.setdefault("engine_utils.get_mp_context", engine_utils.get_mp_context)
    ORIGINALS.setdefault("multiproc_executor.get_mp_context", multiproc_executor.get_mp_context)
    worker_main = ORIGINALS.setdefault("WorkerProc.worker_main", multiproc_executor.WorkerProc.worker_main)

    def bound_worker_main(*args, **kwargs) -> None:
        bind_forked_worker()
        worker_main(*args, **kwargs)

    engine_utils.get_mp_context = _fork_context
    multiproc_executor.get_mp_context = _fork_context
    multiproc_executor.WorkerProc.worker_main = staticmethod(bound_worker_main)
    return True


_FIXES = (
    fix_cpu_expand_batch_to_tokens,
    fix_cpu_seeded_partial_prefill,
    fix_cpu_logprob_rank_compile,
    fix_cpu_gemm_token_buckets,
    fork_cpu_engine_processes,
)


def disabled() -> set[str]:
    """The fixes SPECRL_VLLM_PATCHES turns off: all of them for "0" (or "false", "no"),
    the named ones for "-name,-name", none when unset (or "1"). A name that is no fix is
    an error: a typo must not leave a fix on that a test means to turn off."""
    value = os.environ.get(DISABLE_ENV, "1").strip()
    names = {f.__name__ for f in _FIXES}
    if value.lower() in ("0", "false", "no"):
        return names
    if value.lower() in ("", "1", "true", "yes"):
        return set()
    items = [item.strip() for item in value.split(",") if item.strip()]
    off = {item[1:] for item in items if item.startswith("-")}
    if unknown := sorted({item for item in items if not item.startswith("-")} | (off - names)):
        raise ValueError(
            f"{DISABLE_ENV}={value!r}: {', '.join(unknown)} not understood; use 0, 1 or "
            f"-name for any of {', '.join(sorted(names))}"
        )
    return off


def register() -> None:
    """vLLM general-plugin entry point: apply each fix once per process. In an engine
    process vLLM spawned (a fresh interpreter, as on GPUs), first ask to die with the
    process that started it (as forked ones do: _EngineProcess)."""
    if multiprocessing.parent_process() is not None and _ENGINE_DIES_WITH_PARENT is not None:
        _ENGINE_DIES_WITH_PARENT()
    off = disabled()
    if off:
        log.warning("specrl vLLM fixes disabled by %s: %s", DISABLE_ENV, ", ".join(sorted(off)))
    for fix in _FIXES:
        if fix.__name__ not in _APPLIED and fix.__name__ not in off and fix():
            _APPLIED.append(fix.__name__)
            log.info("specrl applied vLLM fix %s (pid %d)", fix.__name__, os.getpid())


def applied() -> list[str]:
    """Names of the fixes applied in this process."""
    return list(_APPLIED)
