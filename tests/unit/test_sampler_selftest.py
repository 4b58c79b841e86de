"""The startup self-test, run in-process on vLLM's own RejectionSampler: it must fail on
the unpatched CPU build (vLLM issue #55005) and pass with specrl's fix."""

import importlib
import os
from pathlib import Path

import pytest
import tomllib
import torch
from vllm import _custom_ops as ops

from specrl.rollout.engines.vllm import patches, selftest


@pytest.fixture(scope="module")
def sampler():
    return selftest.standalone_rejection_sampler()


def test_fixed_expand_matches_the_reference_semantics():
    x = torch.tensor([0.7, 0.0, 1.3])
    out = patches._expand_batch_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6, 0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    assert out.dtype == torch.float32
    k = patches._expand_batch_to_tokens(torch.tensor([3, 5], dtype=torch.int32), torch.tensor([1, 3]), 3)
    assert k.tolist() == [3, 5, 5] and k.dtype == torch.int32


def test_logprob_ranks_are_counted_without_compiling(monkeypatch):
    """Small logits: vLLM's ranks (entries >= the token's logprob, ties and -inf
    included) counted eagerly; large ones go to vLLM's compiled kernel."""
    from vllm.v1.sample import sampler as sampler_module

    if torch.cuda.is_available():
        pytest.skip("CPU platform only")
    g = torch.Generator().manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(600, 128, generator=g), dim=-1)
    logprobs[::7, 100:] = -float("inf")  # top-k style masking
    logprobs[5, :10] = logprobs[5].max() + 1  # ten tied at the top: rank 10
    tokens = torch.randint(0, 100, (600,), generator=g)
    tokens[5] = 3
    rank_fn = sampler_module.batched_count_greater_than
    monkeypatch.setattr(sampler_module, "batched_count_greater_than", rank_fn)  # restored after
    assert patches.fix_cpu_logprob_rank_compile()
    compiled = []
    monkeypatch.setitem(
        patches.ORIGINALS, "batched_count_greater_than", lambda x, v: compiled.append(x.shape) or x[:, 0]
    )
    ranks = sampler_module.Sampler.gather_logprobs(logprobs, 2, tokens).selected_token_ranks
    chosen = logprobs.gather(-1, tokens[:, None]).numpy()
    assert ranks.tolist() == (logprobs.numpy() >= chosen).sum(-1).tolist()
    assert ranks[5] == 10 and ranks.dtype == torch.int64 and not compiled
    large = torch.zeros(patches.EAGER_RANK_MAX // 128 + 1, 128)
    sampler_module.Sampler.gather_logprobs(large, 2, torch.zeros(len(large), dtype=torch.int64))
    assert compiled == [large.shape]


def test_gemm_token_counts_fall_into_few_buckets_each_at_most_an_eighth_larger():
    counts = range(1, 1 << 16)
    buckets = [patches.gemm_rows(n) for n in counts]
    assert buckets[: patches.GEMM_EXACT_ROWS] == list(range(1, patches.GEMM_EXACT_ROWS + 1))
    assert all(n <= b <= n + n / patches.GEMM_BUCKETS_PER_DOUBLING for n, b in zip(counts, buckets))
    assert all(patches.gemm_rows(b) == b for b in set(buckets))  # a bucket is its own
    assert len(set(buckets)) <= patches.GEMM_KERNELS  # every bucket's kernel is kept
    assert [patches.gemm_rows(n) for n in (17, 33, 100, 300, 513)] == [18, 36, 104, 320, 576]


def test_bucketed_gemm_gives_the_unpadded_results_and_meets_few_counts(monkeypatch):
    """A CPU GEMM over ragged token counts (fix_cpu_gemm_token_buckets): each count's
    rows are computed as without padding, and the kernel meets a bucket's count only."""
    if not ops._supports_onednn:
        pytest.skip("this vLLM build has no oneDNN GEMM")
    original = patches.ORIGINALS.get("onednn_mm", ops.onednn_mm)
    for name in ("onednn_mm", "create_onednn_mm"):
        monkeypatch.setattr(ops, name, patches.ORIGINALS.get(name, getattr(ops, name)))
    met: list[int] = []

    def recording(handler, x, bias):
        met.append(x.numel() // handler.k)
        return original(handler, x, bias)

    create = patches.ORIGINALS.get("create_onednn_mm", ops.create_onednn_mm)
    kept: list[int] = []

    def creating(weight, primitive_cache_size):
        kept.append(primitive_cache_size)
        return create(weight, primitive_cache_size)

    monkeypatch.setitem(patches.ORIGINALS, "onednn_mm", recording)
    monkeypatch.setitem(patches.ORIGINALS, "create_onednn_mm", creating)
    assert patches.fix_cpu_gemm_token_buckets()
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    handler = ops.create_onednn_mm(weight.t(), 32)  # as vLLM's CPU layers ask
    assert kept == [patches.GEMM_KERNELS]  # every bucket's kernel kept, not 32
    counts = [1, 5, 16, 17, *range(100, 400, 3)]  # ragged, as verified drafts are
    for n in counts:
        x = torch.randn(n, 64, generator=g)
        out = ops.onednn_mm(handler, x, bias)
        assert out.shape == (n, 96)
        assert torch.equal(out, original(handler, x, bias))
    assert met == [patches.gemm_rows(n) for n in counts]
    assert len(set(met)) == 21 < len(set(counts)) / 4  # 104 counts
    x = torch.randn(3, 5, 64, generator=g)  # leading dimensions kept
    assert torch.equal(
        ops.onednn_mm(handler, x, None), original(handler, x.reshape(15, 64), None).view(3, 5, 96)
    )


def test_self_test_fails_without_the_fix(sampler, monkeypatch):
    from vllm.v1.sample import rejection_sampler

    if torch.cuda.is_available():
        pytest.skip("the bug is in the CPU kernel shim")
    original = patches.ORIGINALS.get("expand_batch_to_tokens", rejection_sampler.expand_batch_to_tokens)
    assert original.__module__ == "vllm.v1.sample.rejection_sampler"
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", original)
    result = selftest.run(sampler, trials=20000, alpha=1e-4, seed=1234)
    assert not result["passed"], result


def test_self_test_passes_with_the_fix(sampler, monkeypatch):
    from vllm.v1.sample import rejection_sampler

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", patches._expand_batch_to_tokens)
    for seed in (1, 2, 3):
        result = selftest.run(sampler, trials=20000, alpha=1e-4, seed=seed)
        assert result["passed"], result


def test_the_plugin_entry_points_name_specrls_register_functions():
    """vLLM finds specrl's fixes and controls by the dotted paths in pyproject.toml (and
    only logs a path that does not import): each must name a `register` that exists."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert set(plugins) == {"specrl_patches", "specrl_control"}
    for target in plugins.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_plugin_respects_the_disable_switch(monkeypatch):
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor import multiproc_executor
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample import sampler as sampler_module
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = patches.ORIGINALS.get("expand_batch_to_tokens", rejection_sampler.expand_batch_to_tokens)
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", original)
    for name in ("onednn_mm", "create_onednn_mm"):  # restored after the test
        monkeypatch.setattr(ops, name, patches.ORIGINALS.get(name, getattr(ops, name)))
    rank_fn = sampler_module.batched_count_greater_than
    monkeypatch.setattr(sampler_module, "batched_count_greater_than", rank_fn)  # restored after
    for name in ("_sample", "_bookkeeping_sync"):  # restored after the test
        monkeypatch.setattr(GPUModelRunner, name, getattr(GPUModelRunner, name))
    monkeypatch.setattr(engine_utils, "get_mp_context", engine_utils.get_mp_context)
    monkeypatch.setattr(multiproc_executor, "get_mp_context", multiproc_executor.get_mp_context)
    monkeypatch.setattr(
        multiproc_executor.WorkerProc, "worker_main", multiproc_executor.WorkerProc.worker_main
    )
    monkeypatch.setattr(patches, "_APPLIED", [])
    monkeypatch.delenv(patches.START_METHOD_ENV, raising=False)
    monkeypatch.setenv(patches.DISABLE_ENV, "0")
    patches.register()
    assert rejection_sampler.expand_batch_to_tokens is original
    assert patches.applied() == []
    monkeypatch.setenv(patches.DISABLE_ENV, "-fix_cpu_expand_batch_to_tokens")
    patches.register()
    assert rejection_sampler.expand_batch_to_tokens is original
    assert sampler_module.batched_count_greater_than is patches._count_at_least
    assert "fix_cpu_expand_batch_to_tokens" not in patches.applied()
    monkeypatch.setenv(patches.DISABLE_ENV, "1")
    patches.register()
    assert rejection_sampler.expand_batch_to_tokens is patches._expand_batch_to_tokens
    assert sorted(patches.applied()) == [
        "fix_cpu_expand_batch_to_tokens",
        "fix_cpu_gemm_token_buckets",
        "fix_cpu_logprob_rank_compile",
        "fix_cpu_seeded_partial_prefill",
        "fork_cpu_engine_processes",
    ]
    assert sampler_module.batched_count_greater_than is patches._count_at_least


@pytest.mark.parametrize(
    "value, off",
    [
        ("1", set()),
        ("", set()),
        ("0", "all"),
        ("no", "all"),
        ("-fix_cpu_expand_batch_to_tokens", {"fix_cpu_expand_batch_to_tokens"}),
        (
            " -fork_cpu_engine_processes, -fix_cpu_logprob_rank_compile ",
            {"fork_cpu_engine_processes", "fix_cpu_logprob_rank_compile"},
        ),
    ],
)
def test_the_environment_turns_off_all_fixes_or_the_named_ones(monkeypatch, value, off):
    monkeypatch.setenv(patches.DISABLE_ENV, value)
    every = {f.__name__ for f in patches._FIXES}
    assert patches.disabled() == (every if off == "all" else off)


@pytest.mark.parametrize("value", ["-fix_typo", "fix_cpu_expand_batch_to_tokens", "maybe"])
def test_a_fix_name_that_is_no_fix_is_an_error_naming_the_fixes(monkeypatch, value):
    monkeypatch.setenv(patches.DISABLE_ENV, value)
    with pytest.raises(
        ValueError,
        match="fix_cpu_expand_batch_to_tokens, fix_cpu_gemm_token_buckets, fix_cpu_logprob_rank_compile",
    ):
        patches.disabled()


def test_engine_processes_are_forked_unless_the_user_chose_a_start_method(monkeypatch):
    """vLLM's CPU platform forces `spawn` for every process; the fix forks the engine
    core and its workers, unless VLLM_WORKER_MULTIPROC_METHOD was set by the user."""
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor import multiproc_executor

    if torch.cuda.is_available():
        pytest.skip("CPU platform only")
    originals = {
        (engine_utils, "get_mp_context"): patches.ORIGINALS.get(
            "engine_utils.get_mp_context", engine_utils.get_mp_context
        ),
        (multiproc_executor, "get_mp_context"): patches.ORIGINALS.get(
            "multiproc_executor.get_mp_context", multiproc_executor.get_mp_context
        ),
    }
    monkeypatch.setattr(
        multiproc_executor.WorkerProc, "worker_main", multiproc_executor.WorkerProc.worker_main
    )
    for user_choice, expected in ((None, "fork"), ("spawn", "spawn")):
        for (module, name), original in originals.items():
            monkeypatch.setattr(module, name, original)
        monkeypatch.delenv(patches.START_METHOD_ENV, raising=False)
        if user_choice:
            monkeypatch.setenv(patches.START_METHOD_ENV, user_choice)
        assert patches.fork_cpu_engine_processes() is (user_choice is None)
        monkeypatch.setenv(patches.START_METHOD_ENV, "spawn")  # what the CPU platform sets
        assert engine_utils.get_mp_context().get_start_method() == expected
        assert multiproc_executor.get_mp_context().get_start_method() == expected


def _report_binding(queue) -> None:
    patches.bind_forked_worker()
    queue.put((sorted(os.sched_getaffinity(0)), torch.get_num_threads()))


@pytest.mark.parametrize(
    "env",
    [
        {"GOMP_CPU_AFFINITY": "0"},  # vLLM's spelling for GNU OpenMP, which torch ships
        {"OMP_PLACES": "{0}"},
        {"KMP_AFFINITY": "granularity=fine,explicit,proclist=[0]"},
    ],
)
def test_a_forked_worker_is_bound_to_the_cores_vllm_chose_for_it(monkeypatch, env):
    """A forked worker inherits an OpenMP runtime started without the environment vLLM
    sets for the worker's cores (that environment only works in a new process): the
    worker takes it by hand, so it runs OMP_NUM_THREADS threads on those cores (here one
    on core 0) instead of its parent's unbound threads."""
    import multiprocessing

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell bound from unbound")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    for name, value in {"OMP_NUM_THREADS": "1", **env}.items():
        monkeypatch.setenv(name, value)
    parent_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent's unbound threads (the suite runs with one)
    try:
        child = ctx.Process(target=_report_binding, args=(queue,))
        child.start()
    finally:
        torch.set_num_threads(parent_threads)
    cores, threads = queue.get(timeout=60)
    child.join(timeout=60)
    assert (cores, threads) == ([0], 1)
