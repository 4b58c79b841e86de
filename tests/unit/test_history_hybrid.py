"""Hybrid drafting (speculation.history.hybrid): per request, history's draft or the draft
model's, by what each agreed with lately (rollout/hybrid.py, rollout/engines/vllm/history.py
install_hybrid), on a stand-in for vLLM's model runner (named as such: the real one runs
in tests/integration/test_lossless.py's hybrid cell, which proves it lossless). The
stand-in has the attributes the hybrid reads."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from vllm.v1.attention.backend import CommonAttentionMetadata

from specrl.config import SpeculationConfig
from specrl.rollout import hybrid
from specrl.rollout.engines.vllm import history as vllm_history
from specrl.rollout.engines.vllm.history import install_hybrid
from specrl.rollout.history import HistoryIndex
from specrl.rollout.hybrid import (
    RETRY_AFTER,
    ByKind,
    Line,
    Realized,
    SourceScores,
    StepCosts,
    VerifyCost,
    agreed,
    draft_lengths,
)

PROMPT = [1, 2, 3, 4]
MODEL_TOKEN = 9  # what the stand-in draft model drafts at every position


class _InputBatch:
    """Stand-in for vLLM's InputBatch: its rows, and requests joining and leaving through
    add_request and remove_request (the history proposer watches both)."""

    def __init__(self) -> None:
        self.req_ids: list[str] = []
        self.hold({})

    def hold(self, rows: dict[str, list[int]]) -> None:
        """`rows` now (id -> prompt + response so far): those gone are removed first, with
        their rows as they were; the new ones added, their prompt PROMPT's length."""
        for req in [r for r in self.req_ids if r not in rows]:
            self.remove_request(req)
        self.token_ids_cpu = np.zeros((len(rows), 64), dtype=np.int32)
        for i, seq in enumerate(rows.values()):
            self.token_ids_cpu[i, : len(seq)] = seq
        self.num_tokens_no_spec = np.array([len(s) for s in rows.values()])
        new = [r for r in rows if r not in self.req_ids]
        self.req_ids = list(rows)
        self.req_id_to_index = {r: i for i, r in enumerate(rows)}
        for req in new:
            self.add_request(SimpleNamespace(req_id=req, prompt_token_ids=rows[req][: len(PROMPT)]))

    def add_request(self, request: SimpleNamespace) -> None:
        pass  # `hold` has put its row in

    def remove_request(self, req_id: str) -> None:
        del self.req_id_to_index[req_id]


class _Runner:
    """Stand-in for vLLM's GPUModelRunner: an input batch and a draft model that drafts
    MODEL_TOKEN everywhere."""

    def __init__(self, engine_k: int = 3) -> None:
        self.engine_k = engine_k  # the longest draft the engine is built for
        spec = SimpleNamespace(num_speculative_tokens=engine_k)
        self.vllm_config = SimpleNamespace(
            speculative_config=spec, model_config=SimpleNamespace(max_model_len=64)
        )
        self._draft_probs = None
        self.model_k: list[int] = []  # the draft length the draft model was asked for, by call
        self.input_batch = _InputBatch()
        self.requests: dict[str, list[int]] = {}

    def batch(self, rows: dict[str, list[int]]) -> None:
        """The requests in the batch: id -> prompt + response so far (a request no longer
        in it ended, and leaves it as in vLLM: gone from the runner's requests first)."""
        self.requests = dict(rows)  # the runner's live requests (a step's batch holds them all here)
        self.input_batch.hold(rows)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        k = scheduler_output.num_spec_tokens_to_schedule
        self.model_k.append(k)
        return torch.full((len(sampled_token_ids), k), MODEL_TOKEN, dtype=torch.int32)

    def step(
        self, rows: dict[str, list[int]], sampled: list[list[int]], k: int | None = None
    ) -> list[list[int]]:
        """One engine step's drafts for `rows`, which emitted `sampled` last step, the
        scheduler asking for `k` (None: the engine's k)."""
        self.batch(rows)
        scheduled = SimpleNamespace(num_spec_tokens_to_schedule=self.engine_k if k is None else k)
        drafts = self.propose_draft_token_ids(scheduled, sampled)
        return drafts.tolist() if isinstance(drafts, torch.Tensor) else drafts


def _hybrid(min_draft: int, min_match: int = 1) -> tuple[_Runner, object]:
    """The hybrid with "a"'s response to PROMPT (5, 6, 7, 8) in history, and the draft
    model measured once on "m", a request of another prompt, at 0 agreed tokens (the
    policy emitted 35 where it drafted 9): history, at 0 too, is preferred on a tie."""
    runner = _Runner()
    history = install_hybrid(runner, {"min_match": 1}, min_draft, min_match)
    runner.step({"a": [*PROMPT, 5, 6, 7, 8], "m": [30, 31, 32, 33, 34]}, [[8], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, 35]}, [[35]])
    return runner, history


def _model_drafts_every_step(monkeypatch) -> None:
    """History alone expected slower in every step (StepCosts): the draft model drafts."""
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *tokens_and_rest: False)


def test_a_row_with_history_takes_its_draft_and_the_model_fills_the_rest(monkeypatch):
    _model_drafts_every_step(monkeypatch)
    runner, history = _hybrid(min_draft=2)
    # "b" samples the prompt again and has 5, 6: history continues with 7, 8 (two tokens,
    # then the earlier response ends); "c" has a prompt history never saw
    drafts = runner.step({"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23, 24]}, [[6], [24]])
    assert drafts == [[7, 8, MODEL_TOKEN], [MODEL_TOKEN] * 3]
    assert history.rows["history"] == 1 and history.rows["first_pass_only"] == 0


@pytest.mark.parametrize(
    ("history_emitted", "model_emitted", "closed"),
    [([40], [9, 9, 9, 11], True), ([7, 8, 9, 13], [9, 40], False)],
)
def test_a_kind_whose_history_rows_emit_less_than_its_model_rows_stops_taking_history(
    monkeypatch, history_emitted, model_emitted, closed
):
    """Requests of one kind (recurring: samples of PROMPT, whose "a" finished): "b" takes
    history's draft and "d", which history has nothing for, the model's. Where "b" then
    emitted fewer tokens than "d", the kind takes history's drafts no more (Realized, over
    1 row each here): "e", which history drafts for and whose own scores prefer it (every
    request's, here), gets the model's draft; where "b" emitted more, "e" takes history's."""
    _model_drafts_every_step(monkeypatch)
    monkeypatch.setattr(hybrid, "REALIZED_ROWS", 1.0)
    monkeypatch.setattr(SourceScores, "prefers_history", lambda self, req: True)
    runner, history = _hybrid(min_draft=2)
    b, d = [*PROMPT, 5, 6], [*PROMPT, 20, 21]
    assert runner.step({"b": b, "d": d}, [[6], [21]]) == [[7, 8, MODEL_TOKEN], [MODEL_TOKEN] * 3]
    rows = {"b": [*b, *history_emitted], "d": [*d, *model_emitted], "e": [*PROMPT, 5, 6]}
    drafts = runner.step(rows, [history_emitted, model_emitted, [6]])
    assert history.kind("e") == "recurring"
    assert drafts[2] == ([MODEL_TOKEN] * 3 if closed else [7, 8, MODEL_TOKEN])


def test_a_closed_kind_measures_history_afresh_after_retry_after_steps():
    realized = Realized()
    for _ in range(20):  # history's rows 2 tokens, the model's 4: closed once both have 16
        realized.observe("history", 2)
        realized.observe("model", 4)
    assert not realized.open
    for _ in range(RETRY_AFTER - 1):
        realized.step()
    assert not realized.open
    realized.step()
    assert realized.open and realized.rows["history"] == 0.0  # history's rows forgotten
    for _ in range(20):  # now history's rows emit more: it stays open
        realized.observe("history", 6)
    assert realized.open


def test_every_kind_starts_from_the_draft_models_scores_over_the_replica():
    """The draft model's scores where a request starts are the replica's (it drafts a
    request alike whatever its prompt's history); history's are its kind's. A recurring
    request on a replica whose model agreed on fresh ones does not start on history's
    draft at a tie of nothing."""
    kinds = ByKind({"f": "fresh", "r": "recurring"}.get)
    fresh = kinds.of("f")
    fresh.offer("f", "model", [1, 2, 3], at=4)
    fresh.offer("f", "history", [1, 5], at=4)
    fresh.score("f", [1, 2, 3, 4], at=8)  # the model agreed 3, history 1
    recurring = kinds.of("r")
    assert recurring.prior == {"history": 0.0, "model": pytest.approx(0.15)}
    assert fresh.prior == {"history": pytest.approx(0.05), "model": pytest.approx(0.15)}
    assert recurring.acceptance("r", "model") == pytest.approx(1.0)  # 3 agreed, none refused
    assert not recurring.prefers_history("r")


def _long_hybrid(monkeypatch, fit: Line | None) -> tuple[_Runner, object]:
    """history.hybrid_max_draft: the engine built for 6 draft tokens, the draft model
    asked for its own 3, "a"'s response to PROMPT (5 .. 24) in history, the model measured
    on "m", and verification's cost `fit` (VerifyCost: seconds a step, seconds a token)."""
    monkeypatch.setattr(VerifyCost, "fit", lambda self, rows: fit)
    _model_drafts_every_step(monkeypatch)
    runner = _Runner(engine_k=6)
    history = install_hybrid(runner, {"min_match": 1}, 1, 1, model_k=3)
    runner.step({"a": [*PROMPT, *range(5, 25)], "m": [30, 31, 32, 33, 34]}, [[24], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, 35]}, [[35]])  # "a" ended; the model measured
    return runner, history


def test_history_drafts_past_the_draft_models_k_where_its_acceptance_pays(monkeypatch):
    """A request whose history drafts were accepted drafts past the model's 3 up to the
    engine's 6 where verifying a token costs little against what it is expected to add
    (how far by its acceptance rate: test_draft_lengths_...). A step scheduled for fewer
    (a k_schedule's 2) shortens both sources alike."""
    runner, history = _long_hybrid(monkeypatch, Line(0.01, 1e-4, resolved=True))
    # nothing scored for history on this replica yet: acceptance 0, the model's k
    drafts = runner.step({"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23]}, [[6], [23]])
    assert drafts == [[7, 8, 9], [MODEL_TOKEN] * 3]
    # "b"'s 7, 8, 9 accepted (10 sampled after them): history's rate on "b" is 1
    rows = {"b": [*PROMPT, *range(5, 11)], "c": [20, 21, 22, 23, 24]}
    drafts = runner.step(rows, [[7, 8, 9, 10], [24]])
    assert drafts == [list(range(11, 17)), [MODEL_TOKEN] * 3]
    assert history.rows["long_drafts"] == 1 and runner.model_k[-1] == 3
    # 2 asked: 2 from the model's 3, and 5 from history's 6
    assert runner.step({"b": [*PROMPT, *range(5, 17)]}, [list(range(11, 17))], k=2) == [list(range(17, 22))]
    assert runner.model_k[-1] == 2


def _extending_hybrid(
    monkeypatch, fit: Line | None, model_emitted: list[int], min_draft: int = 1, extend: bool = True
) -> tuple[_Runner, object]:
    """The engine built for 6 draft tokens, the draft model asked for its own 3 (MODEL_TOKEN
    each), "a"'s response to PROMPT (5, then the model's 9, 9, 9, then 50 .. 53) in
    history, and the model measured on "m", which emitted `model_emitted` after its draft;
    vLLM's padded drafter path there to switch to (an idle replica's); `extend`:
    history.hybrid_extend."""
    monkeypatch.setattr(VerifyCost, "fit", lambda self, rows: fit)
    _model_drafts_every_step(monkeypatch)
    runner = _Runner(engine_k=6)
    runner.speculative_config = SimpleNamespace(disable_padded_drafter_batch=True)
    runner.discard_request_mask = SimpleNamespace(np=np.zeros(8, dtype=bool))
    history = install_hybrid(runner, {"min_match": 1}, min_draft, 1, model_k=3, extend=extend)
    runner.step({"a": [*PROMPT, 5, 9, 9, 9, 50, 51, 52, 53], "m": [30, 31, 32, 33, 34]}, [[53], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, *model_emitted]}, [model_emitted])  # "a" ended
    return runner, history


def test_history_extends_the_draft_models_draft_where_its_tokens_are_expected_accepted(monkeypatch):
    """A row the draft model drafts in full (its 3) gets history's tokens after them, as far
    as the engine's 6, where history continues the request's tokens and the model's draft
    (history's own draft for "b", 5 onwards, is not taken: nothing of history's agreed on
    this replica yet, the model's 3 did)."""
    runner, history = _extending_hybrid(monkeypatch, None, [9, 9, 9, 35])
    extended = history.rows["extended"]  # "m"'s last draft too: its own 9, 9, 9 went on with 35
    assert runner.step({"b": [*PROMPT, 5]}, [[5]]) == [[9, 9, 9, 50, 51, 52]]
    assert history.rows["extended"] == extended + 1 and history.rows["history"] == 0


def test_without_hybrid_extend_the_models_draft_is_not_extended(monkeypatch):
    runner, history = _extending_hybrid(monkeypatch, None, [9, 9, 9, 35], extend=False)
    assert runner.step({"b": [*PROMPT, 5]}, [[5]]) == [[9, 9, 9]]
    assert history.rows["extended"] == 0


def test_an_extension_is_scored_where_every_one_of_the_models_tokens_agreed():
    """History's tokens after the model's (`own`) are positions of their own (DEPTH_SOURCES
    "extension"): reached only where the model's draft agreed in full, and an extension's
    chance is the model's whole draft's times its own positions'."""
    scores = SourceScores()
    scores.offer("r", "model", [1, 2, 3, 50, 51, 52], at=4, own=3)
    scores.score("r", [1, 2, 3, 50, 51, 60], at=10)  # the model's 3 and the extension's 2 agreed
    scores.offer("r", "model", [1, 2, 3, 70], at=10, own=3)
    scores.score("r", [1, 5], at=12)  # the model's second refused: the extension not reached
    kept, reached = scores._depth["extension"]
    w = scores._weight["extension"]
    assert [k / w for k in kept] == [1.0, 1.0, 0.0] and [n / w for n in reached] == [1.0] * 3  # one draft
    assert scores.acceptance("r", "model") == pytest.approx((0.8 * 3 + 1) / (0.8 * 3 + 1 + 1))
    extension = scores.extension_acceptance("r", 3, 3)
    assert extension == pytest.approx(
        [scores.acceptance("r", "model") ** 3 * p for p in scores.position_acceptance("r", "extension", 3)]
    )
    assert extension[2] < extension[1] <= extension[0] < scores.acceptance("r", "model") ** 3


@pytest.mark.parametrize(
    ("model_emitted", "fit", "extends"),
    [
        # the model's drafts refused: its 3 are not expected accepted, nor what follows
        ([35], None, False),
        # two of its 3 agreed: the extension's first position is expected accepted at ~0.2,
        # free to verify where the cost is unknown, not worth a token at 10 ms a token
        ([9, 9, 35], None, True),
        ([9, 9, 35], Line(0.001, 0.01, resolved=True), False),
    ],
)
def test_an_extension_is_drafted_as_far_as_it_pays(monkeypatch, model_emitted, fit, extends):
    runner, history = _extending_hybrid(monkeypatch, fit, model_emitted)
    extended = history.rows["extended"]
    drafts = runner.step({"b": [*PROMPT, 5]}, [[5]])
    assert drafts == [[9, 9, 9, 50, 51, 52] if extends else [9, 9, 9]]
    assert history.rows["extended"] == extended + extends


@pytest.mark.parametrize(("emitted", "idle"), [([9, 9, 9, 50, 51], False), ([9, 9, 9, 40], True)])
def test_an_extension_counts_for_the_idle_share_once_a_token_of_it_was_accepted(monkeypatch, emitted, idle):
    """A replica where no row takes history's own draft (none is a candidate here: 7
    tokens at least) goes idle whether or not its rows are extended; the first padded step
    scores the extensions, and one that had a token accepted counts for the share, so the
    unpadded step after the padded run stays there (an extension that paid), or goes back
    to the padded path (one that did not)."""
    monkeypatch.setattr(hybrid, "IDLE_ROWS", 1.0)
    monkeypatch.setattr(vllm_history, "IDLE_PADDED_STEPS", 1)
    runner, history = _extending_hybrid(monkeypatch, None, [9, 9, 9, 35], min_draft=7)
    b = [*PROMPT, 5]  # a request of the recurring kind (its prompt has "a"'s response)
    assert runner.step({"b": b}, [[5]]) == [[9, 9, 9, 50, 51, 52]]
    assert not runner.speculative_config.disable_padded_drafter_batch  # none paid yet: idle
    runner.batch({"b": b})
    padded = torch.tensor([[*emitted, *[-1] * (7 - len(emitted))]])
    runner.propose_draft_token_ids(SimpleNamespace(num_spec_tokens_to_schedule=6), padded)
    assert runner.speculative_config.disable_padded_drafter_batch  # its one padded step ran
    b = [*b, *emitted]
    runner.step({"b": [*b, MODEL_TOKEN]}, [[MODEL_TOKEN]])
    assert runner.speculative_config.disable_padded_drafter_batch != idle
    assert history.rows["history"] == 0


@pytest.mark.parametrize("fit", [None, Line(0.01, 1e-4, resolved=False)])
def test_while_verifications_cost_is_unknown_history_drafts_as_far_as_it_offers(monkeypatch, fit):
    """Tried, so that steps of different lengths are timed; its rate decides as before
    (0 before any history draft was scored). A slope not resolved is unknown here too:
    draft_lengths is asked with no cost a token."""
    per_token = []
    lengths = vllm_history.draft_lengths
    monkeypatch.setattr(vllm_history, "draft_lengths", lambda *a: per_token.append(a[3]) or lengths(*a))
    runner, history = _long_hybrid(monkeypatch, fit)
    assert runner.step({"b": [*PROMPT, 5, 6]}, [[6]]) == [[7, 8, 9]]
    assert runner.step({"b": [*PROMPT, *range(5, 11)]}, [[7, 8, 9, 10]]) == [list(range(11, 17))]
    assert history.rows["long_drafts"] == 1
    assert per_token and set(per_token) == {0.0}


def test_verification_cost_is_fitted_to_the_steps_timed():
    cost = VerifyCost()
    for v in range(1, VerifyCost.MIN_STEPS):
        cost.observe(0.010 + 0.002 * v, 1, v)
    assert cost.fit(1) is None  # too few steps
    cost.observe(0.010 + 0.002 * 9, 1, 9)
    a, b, resolved = cost.fit(1)
    assert a == pytest.approx(0.010) and b == pytest.approx(0.002) and resolved
    flat = VerifyCost()  # every step verified as many tokens: no slope to fit
    for _ in range(20):
        flat.observe(0.02, 1, 4)
    assert flat.fit(1) is None
    noisy = VerifyCost()  # more tokens, less time: noise, not a cost
    for v in range(1, 20):
        noisy.observe(0.05 - 0.001 * v, 1, v)
    assert noisy.fit(1) is None


def test_a_slope_the_steps_do_not_resolve_is_told_apart():
    """In the same noise: one odd step among many alike (a line through it has a slope:
    the CPU testbed's c=1 steps had fitted 3 ms a token that way: too little spread to
    fit); steps of many sizes that cost alike, whose slope in this noise is small but
    positive: fitted, not resolved (the path choice takes it, draft_lengths does not);
    and steps of many sizes on a real slope, resolved."""
    noise = [0.003 * np.cos(7.0 * i) for i in range(60)]
    sizes = [4] * 60
    sizes[50] = 7
    odd, flat, sloped = VerifyCost(), VerifyCost(), VerifyCost()
    for v, e in zip(sizes, noise):
        odd.observe(0.013 + e + (0.007 if v == 7 else 0.0), 1, v)
    assert odd.fit(1) is None
    sizes = [200 + (37 * i) % 100 for i in range(60)]  # a large batch's rows vary
    for v, e in zip(sizes, noise):
        flat.observe(0.013 + e, 1, v)
        sloped.observe(0.015 + 1e-4 * v + e, 1, v)
    noise_slope = flat.fit(1)
    assert not noise_slope.resolved and 0 < noise_slope.per_token < 2e-5
    b = sloped.fit(1)
    assert b.resolved and b.per_token == pytest.approx(1e-4, rel=0.3)


def test_a_fit_that_puts_a_steps_cost_outside_its_tokens_below_zero_is_unknown():
    """A negative cost outside the verified tokens is no step's: the line is extrapolating
    past the steps it saw. Taken as it came, its per-token cost is the whole step's over
    its tokens, and draft_lengths cuts every position below ~1 (at c=64 on the CPU
    testbed, RL-Zero epoch 1: 57 of 227 fitted steps read bases down to -125 ms and ~0.2 ms
    a token, and drafted no further than the model's k, 72% of the tokens cut in that run;
    history alone's own steps there fit 16 ms a step and 0.13 ms a token). Unknown
    instead: history drafts as far as it offers, which spreads the tokens the fit sees."""
    negative, positive = VerifyCost(), VerifyCost()
    for i in range(40):
        verified = 100 + (37 * i) % 120
        negative.observe(-0.005 + 2e-4 * verified, 1, verified)
        positive.observe(0.005 + 2e-4 * verified, 1, verified)
    assert negative.fit(1) is None
    base, per_token, _ = positive.fit(1)
    assert base == pytest.approx(0.005) and per_token == pytest.approx(2e-4)


def test_a_cost_per_row_is_not_read_as_a_cost_per_token():
    """A large batch's tail, where the rows and the tokens vary together: each row costs
    0.5 ms (its sampling and bookkeeping), each verified token 0.01 ms. Fitted on the
    tokens alone (as before the rows had a term: the rows given as 1 here) the rows' cost
    reads as ~0.05 ms a token and would cut history's drafts short; with the rows a term
    of their own the tokens' cost is found, and the step's base at a given row count."""
    both, tokens_only = VerifyCost(), VerifyCost()
    for i in range(60):
        rows, draft = 40 + (13 * i) % 25, 3 + (7 * i) % 3
        verified = rows * (1 + draft)
        rest = 0.010 + 5e-4 * rows + 1e-5 * verified + 1e-4 * np.cos(7.0 * i)
        both.observe(rest, rows, verified)
        tokens_only.observe(rest, 1, verified)
    base, per_token, _ = both.fit(50)
    assert per_token == pytest.approx(1e-5, rel=0.3)
    assert base == pytest.approx(0.010 + 5e-4 * 50, rel=0.02)
    assert tokens_only.fit(1).per_token > 4e-5  # ~5x the tokens' own cost


def test_draft_lengths_maximise_the_steps_expected_tokens_per_second():
    """Against every choice of lengths (brute force); rows: (each position's acceptance
    probability, short, longest): geometric ones, none, and one accepted far once started."""
    geometric = [(0.95, 3, 9), (0.7, 3, 9), (0.4, 2, 6), (0.0, 3, 9)]
    rows = [([a ** (j + 1) for j in range(longest)], short, longest) for a, short, longest in geometric]
    rows.append(([0.7] * 9, 3, 9))
    tokens, seconds = 4 + 3.0 + 2.2 + 1.0 + 2.1, 0.03

    def rate(lengths: tuple[int, ...], per_token: float) -> float:
        gain = sum(probs[j] for (probs, short, _), m in zip(rows, lengths) for j in range(short, m))
        extra = sum(m - short for (_, short, _), m in zip(rows, lengths))
        return (tokens + gain) / (seconds + per_token * extra)

    for per_token in (1e-5, 5e-4, 2e-3, 1e-2, 1.0):
        choices = itertools.product(*(range(short, longest + 1) for _, short, longest in rows))
        best = max(rate(c, per_token) for c in choices)
        lengths = draft_lengths(rows, tokens, seconds, per_token)
        assert rate(tuple(lengths), per_token) == pytest.approx(best), per_token
        assert lengths[3] == 3  # nothing accepted there: never drafted further, however cheap
    assert draft_lengths(rows, tokens, seconds, 1e-7) == [9, 9, 6, 3, 9]
    assert draft_lengths(rows, tokens, seconds, 1.0) == [3, 3, 2, 3, 3]
    # where verifying a token costs half a step's average per token emitted, a rate of
    # 0.7 a position stops at its 2nd (0.49), a draft kept at 0.7 whatever the depth runs
    lengths = draft_lengths(rows[1:2] + rows[4:], 2 * 4.0, 0.02, 0.5 * 0.02 / 8.0)
    assert lengths == [3, 9]
    assert draft_lengths([], tokens, seconds, 1e-3) == []


def test_a_sources_acceptance_rate_counts_its_own_tokens_agreed_and_refused():
    scores = SourceScores()
    assert scores.acceptance("r", "history") == 0.0  # nothing scored
    # history's own 2 tokens then the model's 9: both of history's agreed, none refused
    scores.offer("r", "history", [1, 2, 9], at=4, own=2)
    scores.score("r", [1, 2, 3], at=7)
    assert scores.acceptance("r", "history") == 1.0
    # refused at the second token: 1 agreed, 1 refused, the first scoring decayed
    scores.offer("r", "history", [4, 5, 6], at=7)
    scores.score("r", [4, 7], at=9)
    assert scores.acceptance("r", "history") == pytest.approx((0.8 * 2 + 1) / (0.8 * 2 + 1 + 1))
    # cut by the tokens emitted (1 agreed): nothing refused
    refused = scores._runs["r"]["history"][1]
    scores.offer("r", "history", [8, 8, 8], at=9)
    scores.score("r", [8], at=10)
    assert scores._runs["r"]["history"][1] == pytest.approx(0.8 * refused)
    # a new request starts from the replica's rate
    assert 0 < scores.acceptance("new", "history") < 1


def test_deep_positions_are_judged_by_how_often_the_replicas_drafts_kept_them():
    """History drafts that start right tend to run far (a response repeating an earlier
    one). Here every draft is refused at its first token half the time and otherwise kept
    to its end: each position is accepted half the time. A per-token rate (~0.89 here)
    to the power of the position says 0.89 at the first and 0.39 at the eighth; the
    positions' own counts say ~0.5 throughout. A request whose own last drafts were
    refused at once starts lower than the replica."""
    scores = SourceScores()
    draft = list(range(10, 18))
    for n in range(400):
        req = f"r{n}"
        scores.offer(req, "history", draft, at=5)
        emitted = [*draft, 99] if n % 2 else [98]  # kept to the end, or refused at once
        scores.score(req, emitted, at=5 + len(emitted))
    probs = scores.position_acceptance("new", "history", 8)
    assert probs == pytest.approx([0.5] * 8, abs=0.06)
    assert scores.acceptance("new", "history") ** 8 < 0.45 < 0.8 < scores.acceptance("new", "history")
    for at in (20, 21, 22):  # "r1" refused at once 3 times in a row
        scores.offer("r1", "history", draft, at=at)
        scores.score("r1", [98], at=at + 1)
    assert scores.position_acceptance("r1", "history", 2)[0] < 0.8 * probs[0]
    assert (
        scores.position_acceptance("new", "history", 3) == scores.position_acceptance("new", "history", 8)[:3]
    )
    # the counts are kept undecayed with a growing weight, renormalised before it overflows
    # (after ~115,000 drafts): the same state at a weight near the limit reads the same
    import copy

    near = copy.deepcopy(scores)
    near._weight["history"] *= 1e100
    near._depth["history"] = [[c * 1e100 for c in counts] for counts in near._depth["history"]]
    for s in (scores, near):
        s.offer("r2", "history", draft, at=30)
        s.score("r2", [*draft[:3], 97], at=34)
    assert near._weight["history"] < 1e3  # renormalised
    assert near.position_acceptance("new", "history", 8) == pytest.approx(
        scores.position_acceptance("new", "history", 8)
    )


def test_a_match_shorter_than_min_draft_leaves_the_models_draft():
    runner, history = _hybrid(min_draft=3)
    assert runner.step({"b": [*PROMPT, 5, 6]}, [[6]]) == [[MODEL_TOKEN] * 3]
    assert history.rows["history"] == 0


def test_a_match_over_fewer_than_min_match_tokens_leaves_the_models_draft():
    """ "b"'s response so far (0, 5, 6) agrees with "a"'s (5, 6, 7, 8) over its last two
    tokens: confident at min_match 2, not at 3."""
    for min_match, expected in ((2, [7, 8]), (3, [MODEL_TOKEN] * 3)):
        runner, _ = _hybrid(min_draft=1, min_match=min_match)
        assert runner.step({"b": [*PROMPT, 0, 5, 6]}, [[6]]) == [expected], min_match


def test_when_every_row_takes_history_the_draft_model_runs_its_first_pass_only():
    """k=0 asked of the draft model: vLLM's first pass over the tokens just verified (its
    KV cache current), no drafting; the drafts are history's, ragged."""
    runner, history = _hybrid(min_draft=1)
    drafts = runner.step({"b": [*PROMPT, 5], "c": [*PROMPT, 5, 6]}, [[5], [6]])
    assert drafts == [[6, 7, 8], [7, 8]] and runner.model_k[-1] == 0
    assert history.rows["first_pass_only"] == 1 and history.rows["history"] == 2


def test_where_history_alone_pays_a_row_without_a_history_draft_drafts_nothing(monkeypatch):
    """Some rows have no history draft: the draft model's positions are still skipped
    where the tokens per second expected say so (StepCosts, untimed here: tried), those
    rows counted at the one token they emit; the rows with one take history's."""
    asked = []
    pays = StepCosts.first_pass_pays
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a) or pays(self, *a))
    runner, history = _hybrid(min_draft=2)
    # "c": a prompt history never saw; "d": history drafts 8 only, under min_draft
    rows = {"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23, 24], "d": [*PROMPT, 5, 6, 7]}
    drafts = runner.step(rows, [[6], [24], [7]])
    assert drafts == [[7, 8], [], []] and runner.model_k[-1] == 0
    assert history.rows["first_pass_only"] == 1 and history.rows["history"] == 1
    # expected tokens: "b" 1 + history's 0 (the replica's prior), "c" and "d" 1 each,
    # against 1 + the better source's 0 each (the model measured at 0 on "m"); the
    # verification's cost not fitted: each path's time the average step's
    # (the stand-in has no EAGLE drafter whose rows could be left out: its pass runs)
    assert asked[-1] == (pytest.approx(3.0), pytest.approx(3.0), None, "first_pass")


def test_where_verification_is_fitted_each_path_is_timed_at_the_tokens_it_verifies(monkeypatch):
    """History alone verifies "b"'s 2 drafted tokens and one sampled token a row; the
    draft model's path k = 3 drafted tokens a row as well: 1 + 2 + 1 + 1 = 5 tokens
    against 3 x 4 = 12, at 10 ms a step and 1 ms a token, a slope not resolved (for this
    choice the best guess still: VerifyCost)."""
    asked = []
    pays = StepCosts.first_pass_pays
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a) or pays(self, *a))
    monkeypatch.setattr(VerifyCost, "fit", lambda self, rows: Line(0.010, 0.001, resolved=False))
    runner, _ = _hybrid(min_draft=2)
    runner.step({"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23, 24], "d": [*PROMPT, 5, 6, 7]}, [[6], [24], [7]])
    assert asked[-1][2] == (pytest.approx(0.015), pytest.approx(0.022))


def test_with_the_models_positions_each_row_is_expected_at_the_source_it_takes(monkeypatch):
    """The path with the draft model's positions is expected to emit, per row, what the
    source the row takes is expected to: "b" takes history's draft (history scored 3, the
    model 2), so it counts history's 2 tokens at 0.5 each, not the model's higher
    expectation (the maximum of the two was biased up: at c=64 on the CPU testbed such
    steps were expected to emit 281 tokens and emitted 238); "c" (no history) the
    model's 2."""
    asked = []
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a) or False)
    runner, _ = _hybrid(min_draft=2)
    monkeypatch.setattr(SourceScores, "expected", lambda self, req: {"history": 3.0, "model": 2.0})
    monkeypatch.setattr(SourceScores, "position_acceptance", lambda self, req, source, n: [0.5] * n)
    drafts = runner.step({"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23, 24]}, [[6], [24]])
    assert drafts == [[7, 8, MODEL_TOKEN], [MODEL_TOKEN] * 3]
    tokens_first_pass, tokens_full, *_ = asked[-1]
    assert (tokens_first_pass, tokens_full) == (pytest.approx(1 + 1.0 + 1), pytest.approx(1 + 1.0 + 1 + 2))


@pytest.mark.timed
def test_history_alone_is_expected_to_emit_what_its_draft_now_offers(monkeypatch):
    """A step of history's drafts alone is judged by the draft history offers now,
    position by position (SourceScores.position_acceptance), not by the tokens its last
    drafts agreed: "b"'s last draft agreed all 3, its next offers one token (at epoch 0 on
    the CPU testbed, steps taken on such scores emitted 2.3 tokens a row where the draft
    model's emitted 3.6)."""
    asked = []
    pays = StepCosts.first_pass_pays
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a) or pays(self, *a))
    runner = _Runner()
    install_hybrid(runner, {"min_match": 1}, 1, 1)
    runner.step({"a": [*PROMPT, 5, 6, 7, 8, 10], "m": [30, 31, 32, 33, 34]}, [[10], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, 35]}, [[35]])  # "a" ended: in history
    assert runner.step({"b": [*PROMPT, 5]}, [[5]]) == [[6, 7, 8]]
    assert runner.step({"b": [*PROMPT, 5, 6, 7, 8]}, [[6, 7, 8]]) == [[10]]
    tokens_first_pass, tokens_full, *_ = asked[-1]
    assert 1.0 < tokens_first_pass <= 2.0  # its one token, likely accepted (was 1 + 1.5)
    # the model's expected tokens on "b": the replica's, 0 (measured once, on "m"), below history's
    assert tokens_full == pytest.approx(tokens_first_pass)


def test_history_alone_is_expected_to_emit_its_whole_draft_past_the_models_k(monkeypatch):
    """Where history drafts past the model's k (hybrid_max_draft), its rows draft that far
    on either path, so both paths' expected tokens count the whole draft: "b"'s history
    was accepted, and it offers 6 (cut at the model's 3, the tokens both paths share were
    undercounted: at c=64 on the CPU testbed a step of history alone had been expected to
    emit 256 tokens and emitted 488), and both verify it (1 + 6 tokens, at 10 ms a step
    and 1 ms a token)."""
    runner, _ = _long_hybrid(monkeypatch, Line(0.010, 0.001, resolved=False))
    asked = []
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a) or False)
    runner.step({"b": [*PROMPT, 5, 6]}, [[6]])
    assert runner.step({"b": [*PROMPT, *range(5, 11)]}, [[7, 8, 9, 10]]) == [list(range(11, 17))]
    tokens_first_pass, tokens_full, rest, _ = asked[-1]
    assert 1 + 3 < tokens_first_pass <= 1 + 6  # more than the model's 3 positions could
    assert tokens_full == pytest.approx(tokens_first_pass)  # the model's expected: lower
    assert rest == (pytest.approx(0.017), pytest.approx(0.017))


def test_when_history_alone_would_be_slower_the_draft_model_drafts_and_rows_take_the_better(monkeypatch):
    """Every row has a history draft, but the step's tokens per second are expected to be
    higher with the draft model's (StepCosts): it drafts all k positions, and each row
    takes history's draft only where history scores at least as well."""
    _model_drafts_every_step(monkeypatch)
    runner, history = _hybrid(min_draft=1)
    drafts = runner.step({"b": [*PROMPT, 5], "c": [*PROMPT, 5, 6]}, [[5], [6]])
    assert drafts == [[6, 7, 8], [7, 8, MODEL_TOKEN]] and runner.model_k[-1] == 3
    assert history.rows["first_pass_only"] == 0


def test_the_first_pass_path_is_chosen_by_expected_tokens_per_second():
    costs = StepCosts()
    assert costs.first_pass_pays(1.0, 4.0)  # not timed yet: tried
    costs.observe("full", 0.5, None)
    costs.observe("first_pass", 0.1, 1.0)
    # 3 tokens in 1.1 s against 3.5 in 1.5 s: history alone
    assert costs.first_pass_pays(3.0, 3.5)
    costs.rest = 0.2  # a fast target: 3 tokens in 0.3 s against 3.6 in 0.7 s... still
    assert costs.first_pass_pays(3.0, 3.6)
    costs.draft["full"] = 0.15  # a cheap draft model: 3 in 0.3 s against 3.6 in 0.35 s
    assert not costs.first_pass_pays(3.0, 3.6)
    # each path at its own time outside the draft model (VerifyCost's fit at the tokens
    # each verifies): 3 in 0.2 + 0.1 s against 3.6 in 0.3 + 0.15 s; and the other way
    assert costs.first_pass_pays(3.0, 3.6, rest=(0.2, 0.3))
    assert not costs.first_pass_pays(3.0, 3.6, rest=(0.3, 0.2))
    # a step of history alone with no row in the draft model's pass: its own average
    assert not costs.first_pass_pays(3.0, 3.6, rest=(0.25, 0.2))  # 3 in 0.35 s: slower
    assert costs.first_pass_pays(3.0, 3.6, rest=(0.25, 0.2), path="no_pass")  # not timed: tried
    costs.observe("no_pass", 0.01, None)  # 3 in 0.26 s against 3.6 in 0.35 s
    assert costs.first_pass_pays(3.0, 3.6, rest=(0.25, 0.2), path="no_pass")
    costs.observe("no_pass", 0.9, None)  # timed slow: judged by its own average, 0.09 s
    assert not costs.first_pass_pays(3.0, 3.6, rest=(0.25, 0.2), path="no_pass")


def test_a_step_after_the_engine_may_have_idled_times_nothing(monkeypatch):
    """The time between one step's drafts and the next proposal is the step's (StepCosts,
    VerifyCost) only where a request carried over; a batch of new requests may follow an
    idle engine (a bench's rounds: seconds no step cost, which once swamped the averages
    and kept the draft model drafting)."""
    timed = []
    observe = StepCosts.observe
    monkeypatch.setattr(
        StepCosts, "observe", lambda self, path, d, rest: timed.append(rest) or observe(self, path, d, rest)
    )
    runner, _ = _hybrid(min_draft=1)  # "a" and "m", then "m" again: carried over
    assert timed[0] is None and timed[1] is not None
    runner.step({"b": [*PROMPT, 5]}, [[5]])  # only new requests: the engine may have idled
    assert timed[2] is None
    runner.step({"b": [*PROMPT, 5, 6]}, [[6]])
    assert timed[3] is not None


@pytest.mark.timed
def test_the_draft_model_drafts_again_after_a_run_of_first_passes(monkeypatch):
    """After REMEASURE_EVERY steps of history alone, one step where the draft model drafts
    (and is scored) again: its weights may have changed since it was last measured."""
    monkeypatch.setattr(vllm_history, "REMEASURE_EVERY", 2)
    runner, _ = _hybrid(min_draft=1)
    runner.step({"b": [*PROMPT, 5]}, [[5]])
    runner.step({"b": [*PROMPT, 5, 6]}, [[6]])  # history's 6 agreed: history still
    assert runner.step({"b": [*PROMPT, 5, 6, 7]}, [[7]]) == [[8, MODEL_TOKEN, MODEL_TOKEN]]
    assert runner.model_k[-3:] == [0, 0, 3]


def test_a_request_whose_history_drafts_the_policy_rejects_moves_to_the_draft_model(monkeypatch):
    """ "b" takes history's draft 7, 8 (+ the model's 9); the policy then emits 9 where
    history said 7, as the model's draft did: the next step "b" drafts from the model,
    though history still has a match."""
    _model_drafts_every_step(monkeypatch)
    runner, _ = _hybrid(min_draft=1)
    first = runner.step({"b": [*PROMPT, 5, 6], "z": [20, 21, 22, 23, 24]}, [[6], [24]])
    assert first[0] == [7, 8, MODEL_TOKEN]
    # history's 7 rejected, 9 emitted; history would now continue "6, 9" with nothing,
    # so "b" is given a context history matches: the earlier response's 5, 6, 7
    drafts = runner.step({"b": [*PROMPT, 5, 6, 7], "z": [20, 21, 22, 23, 24, 25]}, [[9], [25]])
    assert drafts[0] == [MODEL_TOKEN] * 3


def _record_lookups(monkeypatch) -> list[int]:
    """QUIET_AFTER and PROBE_EVERY at 2, the draft model drafting every step; the list
    each history lookup appends its context's last token to."""
    monkeypatch.setattr(hybrid, "QUIET_AFTER", 2)
    monkeypatch.setattr(hybrid, "PROBE_EVERY", 2)
    looked: list[int] = []
    propose = HistoryIndex.propose

    def recording(self, key, seq, context, *args, **kwargs):
        looked.append(int(context[-1]))
        return propose(self, key, seq, context, *args, **kwargs)

    monkeypatch.setattr(HistoryIndex, "propose", recording)
    _model_drafts_every_step(monkeypatch)
    return looked


def test_a_request_history_has_nothing_for_is_looked_up_only_now_and_then(monkeypatch):
    """A request whose history drafts were not taken QUIET_AFTER steps in a row is looked
    up (and scored) only every PROBE_EVERY steps; its tokens still go into its prompt's
    tree every step (a sibling drafts from them); once a lookup's draft is taken, it is
    looked up every step again."""
    looked = _record_lookups(monkeypatch)
    runner, _ = _hybrid(min_draft=1)
    z = [20, 21, 22, 23]  # a prompt history never saw
    looked.clear()
    for t in range(24, 30):  # quiet 0 and 1: looked up; then every other step
        assert runner.step({"z": [*z, *range(24, t + 1)]}, [[t]]) == [[MODEL_TOKEN] * 3]
    assert looked == [24, 25, 26, 28]
    runner.step({"z": [*z, *range(24, 31)]}, [[30]])  # a probe
    # a sibling behind it drafts the tokens "z" emitted on steps it was not looked up
    drafts = runner.step({"z": [*z, *range(24, 32)], "y": [*z, 24, 25, 26]}, [[31], [26]])
    assert drafts == [[MODEL_TOKEN] * 3, [27, 28, 29]] and looked[-2:] == [30, 26]
    # the sibling wrote 50 .. 53; at its next probe "z" emits 50 and takes history's draft
    # (as long as the match: 1 token), the model's after it
    y, z_now = [*z, 24, 25, 26, 50, 51, 52, 53], [*z, *range(24, 32), 50]
    drafts = runner.step({"y": y, "z": z_now}, [[50, 51, 52, 53], [50]])
    assert drafts[1] == [51, MODEL_TOKEN, MODEL_TOKEN] and looked[-1] == 50
    runner.step({"y": [*y, 54], "z": [*z_now, 51]}, [[54], [51]])
    assert looked[-1] == 51  # looked up again the next step


def test_a_new_request_on_a_replica_whose_rows_seldom_take_history_starts_quiet(monkeypatch):
    """Where under its idle share of the last rows of a request's kind took history's draft
    (IDLE_ROWS of them at least), a new request of that kind is looked up on its first
    step, then only every PROBE_EVERY steps; one whose lookup is taken is looked up every
    step again. A recurring request (its prompt has finished responses) is judged by its
    own kind's share: looked up every step while the fresh requests' kind is idle."""
    looked = _record_lookups(monkeypatch)
    monkeypatch.setattr(hybrid, "IDLE_ROWS", 5.0)
    runner, history = _hybrid(min_draft=1)  # 3 rows so far, none took history's draft
    for t in range(24, 27):  # 6 fresh rows (5.8 decayed): that kind is idle from here on
        runner.step({"z": [20, 21, 22, 23, *range(24, t + 1)]}, [[t]])
    looked.clear()
    w = [40, 41, 42, 43]  # another prompt history never saw
    for t in range(24, 29):
        runner.step({"w": [*w, *range(24, t + 1)]}, [[t]])
    assert looked == [24, 26, 28] and history.kind("w") == "fresh"
    # "v", a sample of PROMPT again ("a"'s response finished), is recurring: looked up from
    # its first step, it takes the draft
    looked.clear()
    runner.step({"v": [*PROMPT, 5]}, [[5]])
    drafts = runner.step({"v": [*PROMPT, 5, 6]}, [[6]])
    assert history.kind("v") == "recurring"
    assert drafts == [[7, 8, MODEL_TOKEN]] and looked == [5, 6]
    for t in range(24, 26):  # a fresh one still starts quiet
        runner.step({"u": [50, 51, 52, 53, *range(24, t + 1)]}, [[t]])
    assert looked[2:] == [24]


def _idle_hybrid(monkeypatch) -> tuple[_Runner, object]:
    """The hybrid on a runner with vLLM's padded drafter path (the stand-in's switch and
    discard mask), idle after 3 rows none of which took history's draft, its padded runs
    3 steps long; the draft model drafts every unpadded step."""
    _model_drafts_every_step(monkeypatch)
    monkeypatch.setattr(hybrid, "IDLE_ROWS", 3.0)
    monkeypatch.setattr(vllm_history, "IDLE_PADDED_STEPS", 3)
    runner = _Runner()
    runner.speculative_config = SimpleNamespace(disable_padded_drafter_batch=True)
    runner.discard_request_mask = SimpleNamespace(np=np.zeros(8, dtype=bool))
    return runner, install_hybrid(runner, {"min_match": 1}, 1, 1)


def _padded(*rows: list[int]) -> torch.Tensor:
    """A padded step's sampled tokens: each row's, -1 past them (4 positions)."""
    return torch.tensor([[*row, *[-1] * (4 - len(row))] for row in rows])


def test_an_idle_replica_runs_steps_on_the_padded_path_and_history_takes_their_tokens_after(monkeypatch):
    """On a replica where history is idle, a step in which no row took history's draft
    turns vLLM's padded drafter path on for the next IDLE_PADDED_STEPS steps (3 here):
    those hand the draft model's drafts through (called with the step's sampled tensor)
    and leave history's trees alone; then the unpadded path is back, and history takes
    the padded steps' tokens from the batch's rows (vLLM's bookkeeping wrote them): every
    row's before any row drafts, and a row's that leaves the batch as it leaves."""
    runner, history = _idle_hybrid(monkeypatch)
    z, m = [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35]
    runner.step({"z": z[:-1], "m": m[:-1]}, [[24], [34]])
    assert runner.speculative_config.disable_padded_drafter_batch  # 2 rows seen, not yet
    runner.step({"z": z, "m": m}, [[25], [35]])
    assert not runner.speculative_config.disable_padded_drafter_batch
    held = history.index.tokens
    scheduled = SimpleNamespace(num_spec_tokens_to_schedule=runner.engine_k)
    for step, (z_emitted, m_emitted) in enumerate((([26, 27], [36]), ([40, 41, 42, 43], [37]), ([50], [38]))):
        runner.batch({"z": z, "m": m})  # before bookkeeping: the tokens of the steps before
        drafts = runner.propose_draft_token_ids(scheduled, _padded(z_emitted, m_emitted))
        assert drafts.tolist() == [[MODEL_TOKEN] * 3] * 2
        assert runner.speculative_config.disable_padded_drafter_batch == (step == 2)
        z, m = [*z, *z_emitted], [*m, *m_emitted]
    assert history.rows["padded"] == 3 and history.index.tokens == held  # the trees untouched
    runner.batch({"z": z, "m": m})  # the last padded step's bookkeeping
    # "y", a new sample of z's prompt ahead of "z" in the batch, drafts what "z" emitted
    # on the padded steps; "w", one of m's, what "m" did before it ended
    drafts = runner.step({"y": [*z[:6], 26], "z": z, "w": [*m[:6], 36]}, [[26], [50], [36]])
    assert drafts[0] == [27, 40, 41] and drafts[2] == [37, 38, MODEL_TOKEN]


def test_a_row_vllm_discards_on_a_padded_step_emitted_nothing(monkeypatch):
    """What a padded step emitted (scored against the drafts offered before it) leaves out
    a row vLLM discards (a partial prefill's)."""
    runner, history = _idle_hybrid(monkeypatch)
    runner.batch({"z": [20, 21, 22, 23, 24], "m": [30, 31, 32, 33]})
    runner.discard_request_mask.np[1] = True
    assert history.emitted(_padded([26, 27], [36])) == [("z", [26, 27], 7)]


def test_a_response_run_wholly_on_the_padded_path_is_history_for_its_prompt(monkeypatch):
    """On an idle replica a request may run on the padded path from its first step to
    its last: it is started as it joins the batch and its tokens taken as it leaves, so
    that a later request of its prompt is recurring and drafts from its response."""
    runner, history = _idle_hybrid(monkeypatch)
    z, m = [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]
    runner.step({"z": z, "m": m}, [[24], [34]])
    runner.step({"z": [*z, 25], "m": [*m, 35]}, [[25], [35]])
    assert not runner.speculative_config.disable_padded_drafter_batch  # idle: padded steps
    scheduled = SimpleNamespace(num_spec_tokens_to_schedule=3)
    p = [70, 71, 72, 73]  # joins on a padded step
    for emitted in ([80, 81], [82, 83]):
        runner.batch({"z": [*z, 25], "m": [*m, 35], "p": p})
        runner.propose_draft_token_ids(scheduled, _padded([26], [36], emitted))
        p = [*p, *emitted]
    runner.batch({"z": [*z, 25], "m": [*m, 35], "p": p})  # bookkeeping; "p" ends
    drafts = runner.step({"q": [70, 71, 72, 73, 80]}, [[80]])
    assert history.kind("q") == "recurring" and drafts == [[81, 82, 83]]


def test_a_request_that_leaves_the_batch_unfinished_keeps_its_response_open():
    """A request vLLM takes out of the batch while it still runs (preempted, or not
    scheduled this step) leaves its tokens in its prompt's tree, its response open; back,
    it goes on with the same response, finished once it ends."""
    runner, history = _hybrid(min_draft=1)
    key = vllm_history.prompt_key(PROMPT)
    finished = history.index.finished(key)  # "a"'s, from _hybrid
    m = [30, 31, 32, 33, 34, 35]
    runner.step({"b": [*PROMPT, 20], "m": m}, [[20], [35]])
    runner.requests = {"b": [*PROMPT, 20, 21], "m": m}  # "b" preempted: still the runner's
    runner.input_batch.hold({"m": m})
    assert history.index.finished(key) == finished
    runner.step({"b": [*PROMPT, 20, 21, 22], "m": [*m, 36]}, [[22], [36]])
    runner.step({"m": [*m, 36, 37]}, [[37]])  # "b" ended
    assert history.index.finished(key) == finished + 1
    drafts = runner.step({"c": [*PROMPT, 20]}, [[20]])  # a sample of PROMPT after "b"
    assert drafts[0][:2] == [21, 22]


def test_an_input_batch_vllm_builds_anew_is_watched_too(monkeypatch):
    """vLLM may replace the runner's input batch (it re-initializes it as the KV cache is
    set up): the new one's requests are seen joining and leaving, so history goes on
    drafting; a request that joined it unseen drafts nothing from history, and no error."""
    _model_drafts_every_step(monkeypatch)
    runner, history = _hybrid(min_draft=1)
    unseen = {"b": [*PROMPT, 5, 6]}
    runner.input_batch = _InputBatch()
    runner.input_batch.req_ids, runner.input_batch.req_id_to_index = ["b"], {"b": 0}  # joined unseen
    runner.input_batch.token_ids_cpu = np.array([[*unseen["b"], *[0] * 58]], dtype=np.int32)
    runner.input_batch.num_tokens_no_spec = np.array([6])
    runner.requests = dict(unseen)
    drafts = runner.propose_draft_token_ids(SimpleNamespace(num_spec_tokens_to_schedule=3), [[6]])
    assert drafts == [[MODEL_TOKEN] * 3]
    # "b" leaves; "c", a sample of PROMPT, joins the new batch, seen: history drafts for it
    assert runner.step({"c": [*PROMPT, 5, 6]}, [[6]]) == [[7, 8, MODEL_TOKEN]]
    assert history.kind("c") == "recurring"


def test_an_idle_replica_takes_history_again_once_its_drafts_agree_on_the_padded_steps(monkeypatch):
    """A replica that went idle (a first epoch's: the draft model preferred, no row taking
    history's draft) scores the drafts offered in its unpadded step against what the padded
    step after it emitted: where history's agreed, the request takes history's draft at the
    next unpadded step (a later epoch's history is used), not the draft model's for good."""
    runner, history = _idle_hybrid(monkeypatch)
    a = [*PROMPT, *range(50, 62)]  # a sibling's response to PROMPT, in flight
    m = [30, 31, 32, 33, 34]
    runner.step({"a": a, "m": m}, [[61], [34]])
    # the draft model's drafts agree on "m": preferred over history, never measured yet;
    # "v", a new sample of PROMPT, is offered history's draft and takes the model's
    drafts = runner.step({"a": a, "m": [*m, 9, 9, 9, 9], "v": [*PROMPT, 50]}, [[], [9, 9, 9, 9], [50]])
    assert drafts[2] == [MODEL_TOKEN] * 3 and history.kind("v") == "fresh"
    assert not runner.speculative_config.disable_padded_drafter_batch  # idle: padded steps
    scheduled = SimpleNamespace(num_spec_tokens_to_schedule=runner.engine_k)
    for v_emitted in ([51, 52, 53, 54], [55, -1, -1, -1], [56, -1, -1, -1]):  # history's tokens
        runner.batch({"a": a, "m": [*m, 9, 9, 9, 9], "v": [*PROMPT, 50]})  # before bookkeeping
        sampled = torch.tensor([[-1] * 4, [9, -1, -1, -1], v_emitted])
        runner.propose_draft_token_ids(scheduled, sampled)
    assert runner.speculative_config.disable_padded_drafter_batch
    drafts = runner.step({"v": [*PROMPT, *range(50, 58)]}, [[57]])
    assert drafts == [[58, 59, 60]]


class _EagleRunner(_Runner):
    """The stand-in runner calling an EAGLE drafter's `propose` (the pathway whose rows the
    hybrid can leave out: drafter_rows.py), one token a row, which records each pass's
    requests (a row's token: its index)."""

    def __init__(self) -> None:
        super().__init__()
        self.drafter = SimpleNamespace(needs_extra_input_slots=False, uses_mrope=False, propose=self._pass)
        self.passes: list[list[str]] = []

    def _pass(self, k, tokens, positions, hidden, next_ids, to_sample, cad, *args, **kwargs):
        self.passes.append([self.input_batch.req_ids[int(t)] for t in tokens])
        return torch.full((cad.num_reqs, k), MODEL_TOKEN, dtype=torch.int64)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        k = scheduler_output.num_spec_tokens_to_schedule
        self.model_k.append(k)
        n = len(sampled_token_ids)
        rows, starts = torch.arange(n), torch.arange(n + 1, dtype=torch.int32)
        cad = CommonAttentionMetadata(
            query_start_loc=starts,
            query_start_loc_cpu=starts.clone(),
            seq_lens=torch.ones(n, dtype=torch.int32),
            num_reqs=n,
            num_actual_tokens=n,
            max_query_len=1,
            max_seq_len=1,
            block_table_tensor=torch.zeros((n, 1), dtype=torch.int32),
            slot_mapping=rows,
        )
        return self.drafter.propose(k, rows, rows, rows[:, None].float(), rows, None, cad, None)


@pytest.mark.parametrize("leave_out_after", [2, 0])
def test_a_request_history_drafts_alone_for_long_leaves_the_draft_models_passes(monkeypatch, leave_out_after):
    """After `leave_out_after` steps in a row taking history's draft, "b"'s rows leave the
    draft model's passes while history keeps it; when history has no draft for it, it is
    back in them and takes the model's. "z" (a prompt history never saw) stays in. With
    0, no request leaves."""
    _model_drafts_every_step(monkeypatch)
    runner = _EagleRunner()
    history = install_hybrid(runner, {"min_match": 1}, 1, 1, leave_out_after=leave_out_after)
    runner.step({"a": [*PROMPT, *range(5, 25)], "m": [30, 31, 32, 33, 34]}, [[24], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, 35]}, [[35]])  # the model measured, at 0
    z = [20, 21, 22, 23, 24]
    drafts = runner.step({"b": [*PROMPT, 5], "z": z}, [[5], [24]])
    assert drafts == [[6, 7, 8], [MODEL_TOKEN] * 3] and runner.passes[-1] == ["b", "z"]
    drafts = runner.step({"b": [*PROMPT, *range(5, 10)], "z": [*z, 25]}, [[6, 7, 8, 9], [25]])
    assert drafts[0] == [10, 11, 12] and runner.passes[-1] == ["b", "z"]  # its second step
    drafts = runner.step({"b": [*PROMPT, *range(5, 14)], "z": [*z, 25, 26]}, [[10, 11, 12, 13], [26]])
    assert drafts == [[14, 15, 16], [MODEL_TOKEN] * 3] and history.rows["history"] == 3
    left = leave_out_after > 0
    assert runner.passes[-1] == (["z"] if left else ["b", "z"]) and history.rows["left_out"] == left
    # the policy leaves "a"'s text: history has no draft, the model drafts for "b" again
    drafts = runner.step({"b": [*PROMPT, *range(5, 14), 99], "z": [*z, 25, 26, 27]}, [[99], [27]])
    assert drafts == [[MODEL_TOKEN] * 3] * 2 and runner.passes[-1] == ["b", "z"]


def test_a_step_of_history_alone_leaves_its_rows_out_of_the_first_pass_but_a_new_requests(monkeypatch):
    """In a step of history alone the rows taking history's draft leave the draft model's
    first pass, but for a request's first step (the pass over its prompt); where no row is
    left in it, no pass runs and the step is timed as its own path (`no_pass`), not as
    the first pass's."""
    asked, timed = [], []
    monkeypatch.setattr(StepCosts, "first_pass_pays", lambda self, *a: asked.append(a[3]) or True)
    observe = StepCosts.observe
    monkeypatch.setattr(
        StepCosts, "observe", lambda self, path, d, rest: timed.append(path) or observe(self, path, d, rest)
    )
    runner = _EagleRunner()
    history = install_hybrid(runner, {"min_match": 1}, 1, 1, leave_out_after=2)
    runner.step({"a": [*PROMPT, *range(5, 25)], "m": [30, 31, 32, 33, 34]}, [[24], [34]])
    runner.step({"m": [30, 31, 32, 33, 34, 35]}, [[35]])  # the model measured
    passes = len(runner.passes)
    # "b" and "c" new: both take history's draft, both in the pass (their prompts')
    drafts = runner.step({"b": [*PROMPT, 5], "c": [*PROMPT, 5, 6]}, [[5], [6]])
    assert drafts == [[6, 7, 8], [7, 8, 9]] and runner.model_k[-1] == 0
    assert runner.passes[-1] == ["b", "c"] and asked[-1] == timed[-1] == "first_pass"
    # both seen before: out of the pass after one step of history (not yet out of the
    # model's passes, which takes hybrid_leave_out_after = 2): no pass at all
    drafts = runner.step(
        {"b": [*PROMPT, *range(5, 10)], "c": [*PROMPT, *range(5, 11)]}, [[6, 7, 8, 9], [7, 8, 9, 10]]
    )
    assert drafts == [[10, 11, 12], [11, 12, 13]] and len(runner.passes) == passes + 1
    assert asked[-1] == timed[-1] == "no_pass" and history.rows["left_out"] == 2
    # "d" new: the pass runs over it alone
    drafts = runner.step({"b": [*PROMPT, *range(5, 14)], "d": [*PROMPT, 5]}, [[10, 11, 12, 13], [5]])
    assert drafts == [[14, 15, 16], [6, 7, 8]] and runner.passes[-1] == ["d"]
    assert asked[-1] == timed[-1] == "first_pass" and history.rows["first_pass_only"] == 3


class _TimedEagleRunner(_EagleRunner):
    """_EagleRunner whose drafter has a torch model: its first pass is one forward, each
    later position another after POSITION_S (the draft model's k - 1 sequential ones)."""

    POSITION_S = 0.02

    def __init__(self) -> None:
        super().__init__()
        self.drafter.model = torch.nn.Identity()

    def _pass(self, k, tokens, positions, hidden, next_ids, to_sample, cad, *args, **kwargs):
        for _ in range(max(k, 1)):
            self.drafter.model(hidden)
            time.sleep(self.POSITION_S if k > 1 else 0.0)
        return super()._pass(k, tokens, positions, hidden, next_ids, to_sample, cad, *args, **kwargs)


@pytest.mark.timed
def test_a_step_with_the_models_positions_times_its_first_pass_too(monkeypatch):
    """A step where the draft model drafts its k positions also times its first pass (to
    its first forward's end: FirstForward), as a step of history alone's would be: the
    first pass's cost is then known from every step that runs one, and one slow step of
    history alone (a pass over many new prompts) cannot keep the path untaken. The hook is
    on the model for that call only: outside it (an idle replica's padded steps) the draft
    model's forwards are EAGLE-3 alone's."""
    _model_drafts_every_step(monkeypatch)
    timed = []
    observe = StepCosts.observe
    monkeypatch.setattr(
        StepCosts,
        "observe",
        lambda self, path, d, rest: timed.append((path, d)) or observe(self, path, d, rest),
    )
    runner = _TimedEagleRunner()
    install_hybrid(runner, {"min_match": 1}, 1, 1)
    runner.step({"m": [30, 31, 32, 33, 34]}, [[34]])
    (full, full_s), (first, first_s) = timed
    assert (full, first) == ("full", "first_pass")
    assert first_s < _TimedEagleRunner.POSITION_S <= full_s  # the k - 1 positions after it: not in it
    assert not runner.drafter.model._forward_hooks


def test_a_draft_is_scored_by_its_leading_tokens_the_step_emitted():
    assert agreed([7, 8, 9], [7, 8, 4, 1]) == 2 and agreed([7, 8], [7, 8, 9]) == 2
    assert agreed([7], [3, 7]) == 0 and agreed([], [1]) == 0
    scores = SourceScores()
    assert not scores.prefers_history("r")  # the draft model not measured yet: it drafts
    scores.offer("r", "history", [1, 2, 3], at=4)
    scores.offer("r", "model", [1, 5, 5], at=4)
    scores.score("r", [1, 2, 3, 4], at=8)  # history agreed 3, the model 1
    assert scores.prefers_history("r") and scores.prefers_history("new")
    assert scores.prior == {"history": pytest.approx(0.15), "model": pytest.approx(0.05)}
    for at in (8, 11):
        scores.offer("r", "history", [9, 9, 9], at=at)
        scores.offer("r", "model", [1, 2], at=at)
        scores.score("r", [1, 2, 7], at=at + 3)  # history 0, the model 2: 0.375 vs 1.75
    assert not scores.prefers_history("r")
    # a new request starts from the replica's scores, which moved too: 0.135 vs 0.24
    assert not scores.prefers_history("new")
    prior = dict(scores.prior)
    scores.offer("r", "history", [1], at=14)
    scores.score("r", [1], at=16)  # not the step after the offer (one was skipped): not scored
    scores.offer("r", "history", [1], at=16)
    scores.retain([])  # "r" ended: what was offered for it is forgotten, not scored
    scores.score("r", [1], at=17)
    assert scores.prior == prior


def test_draft_probabilities_are_refused(monkeypatch):
    """With probabilistic draft sampling vLLM verifies against the draft model's
    probabilities, which an overlaid row no longer follows: not lossless, so refused."""
    _model_drafts_every_step(monkeypatch)
    runner, _ = _hybrid(min_draft=1)
    runner._draft_probs = torch.ones(1, 3, 4)
    with pytest.raises(RuntimeError, match="deterministic"):
        runner.step({"b": [*PROMPT, 5, 6], "z": [20, 21, 22, 23, 24]}, [[6], [24]])


def test_hybrid_needs_a_draft_model_and_the_index_gets_only_its_settings():
    for method in ("history", "ngram", "none"):
        with pytest.raises(ValidationError, match="hybrid needs a draft model"):
            SpeculationConfig(method=method, history={"hybrid": True})
    spec = SpeculationConfig(method="eagle3", draft="zoo:eagle3-domain", history={"hybrid": True})
    assert spec.drafts_from_history and not SpeculationConfig(method="eagle3", draft="x").drafts_from_history
    HistoryIndex(**spec.history.index_settings())  # no key the index does not take


def test_history_drafting_past_the_model_builds_the_engine_for_the_longer_draft():
    eagle = {"method": "eagle3", "draft": "zoo:eagle3-domain", "num_speculative_tokens": 3}
    spec = SpeculationConfig(**eagle, history={"hybrid": True, "hybrid_max_draft": 8})
    assert spec.engine_k == 8 and spec.k == 3
    assert "hybrid_max_draft" not in spec.history.index_settings()
    assert SpeculationConfig(**eagle, history={"hybrid": True}).engine_k == 3
    assert "hybrid_extend" not in spec.history.index_settings()
    refused = {
        "needs speculation.history.hybrid": {"history": {"hybrid_max_draft": 8}},
        "below num_speculative_tokens": {"history": {"hybrid": True, "hybrid_max_draft": 2}},
        "hybrid_extend needs hybrid_max_draft": {"history": {"hybrid": True, "hybrid_extend": True}},
        "adaptive cannot run": {
            "history": {"hybrid": True, "hybrid_max_draft": 8},
            "adaptive": {"enabled": True},
        },
    }
    for message, extra in refused.items():
        with pytest.raises(ValidationError, match=message):
            SpeculationConfig(**eagle, **extra)
