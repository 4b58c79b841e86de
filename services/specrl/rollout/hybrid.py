"""Which source drafts a request's next step in the hybrid (speculation.history.hybrid:
history or the draft model), chosen by what each has been accepted at on that request.

Both sources draft deterministically, and for a deterministic draft the verifier accepts
token x with probability p(x), the probability that the policy samples x. The tokens a
step emits are samples of the policy (that is what lossless means), so any deterministic
draft of the step can be scored against them, not only the one that was verified: its
leading tokens that agree with the emitted ones are distributed as its accepted tokens
would have been, censored at the tokens emitted (the accepted ones and one more). The
verified draft's score is exact; the other's is at most one more, so a request moves to
the other source only when that one agreed past where the verified draft was rejected,
a little stickiness on the side of the source it has. So every step scores every draft a
source made for it, chosen or not, and a request's next draft comes from the source
whose recent drafts agreed most (SourceScores). Ties go to history, once the draft model
has been measured on the replica at all; whether a step of history alone skips the draft
model's positions is a question of tokens per second (StepCosts).

A request starts from the replica's running scores: a new request on a prompt whose
history drafts well starts trusting history, and a weak draft model is left behind after
its first steps, a strong one kept.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

SOURCES = ("history", "model")
DECAY = 0.5  # a request's score: its last few steps (a span repeated, or not)
PRIOR_DECAY = 0.95  # the replica's scores, where a request starts
# steps in a row that every request drafts from history (the draft model's first pass
# only) before one where the draft model drafts too and is measured again (its weights
# may have been updated since)
REMEASURE_EVERY = 16


def agreed(draft: Sequence[int], emitted: Sequence[int]) -> int:
    """Leading tokens of `draft` that the step emitted too (module docstring)."""
    n = 0
    for d, e in zip(draft, emitted):
        if d != e:
            break
        n += 1
    return n


class SourceScores:
    """Per request, a moving average of the tokens each source's drafts agreed with the
    tokens emitted after them; the replica's own over every request as the start. An
    offer is scored only against the step right after it (`at`: the request's tokens
    when it was offered; a step the drafter skipped would misalign them)."""

    def __init__(self) -> None:
        self.prior = dict.fromkeys(SOURCES, 0.0)
        self.measured = dict.fromkeys(SOURCES, 0)  # drafts scored, over the replica
        self._scores: dict[str, dict[str, float]] = {}
        self._offered: dict[str, tuple[int, dict[str, list[int]]]] = {}

    def score(self, req: str, emitted: Sequence[int], at: int) -> None:
        """The tokens `req`'s last step emitted, `at` its tokens now: every draft offered
        for that step is scored."""
        offered_at, drafts = self._offered.pop(req, (None, {}))
        if offered_at != at - len(emitted):
            return
        scores = self._scores.setdefault(req, dict(self.prior))
        for source, draft in drafts.items():
            n = agreed(draft, emitted)
            scores[source] = DECAY * scores[source] + (1 - DECAY) * n
            self.prior[source] = PRIOR_DECAY * self.prior[source] + (1 - PRIOR_DECAY) * n
            self.measured[source] += 1

    def offer(self, req: str, source: str, draft: Sequence[int], at: int) -> None:
        """`source` drafted `draft` for `req`'s next step (verified or not), `at` the
        request's tokens so far."""
        offered_at, drafts = self._offered.setdefault(req, (at, {}))
        if offered_at != at:  # left over from a step that was not scored
            self._offered[req] = offered_at, drafts = at, {}
        drafts[source] = list(draft)

    def expected(self, req: str) -> dict[str, float]:
        """Tokens each source's next draft for `req` is expected to have accepted."""
        return self._scores.get(req, self.prior)

    def prefers_history(self, req: str) -> bool:
        if not self.measured["model"]:  # never measured here: it drafts, and is measured
            return False
        scores = self.expected(req)
        return scores["history"] >= scores["model"]

    def retain(self, reqs: Collection[str]) -> None:
        """Forget the requests not in `reqs` (they ended)."""
        for table in (self._scores, self._offered):
            for req in table.keys() - reqs:
                del table[req]


class StepCosts:
    """Moving averages of an engine step's seconds: outside the draft model (`rest`: the
    target's forward, sampling, bookkeeping, history's lookup) and of the draft model's
    work by path (`full`: all k positions; `first_pass`: its first pass only). Whether a
    step should draft from history alone, skipping the draft model's k - 1 sequential
    positions, is a question of tokens per second, not of tokens alone: a history draft a
    little worse than the model's, or none for a row or two, still pays when it saves the
    model's forwards (small batches, where a forward costs the same for 1 row as for 4)."""

    def __init__(self) -> None:
        self.rest: float | None = None
        self.draft: dict[str, float | None] = {"full": None, "first_pass": None}

    def observe(self, path: str, draft_s: float, rest_s: float | None) -> None:
        self.draft[path] = _ema(self.draft[path], draft_s)
        if rest_s is not None:
            self.rest = _ema(self.rest, rest_s)

    def first_pass_pays(self, tokens_first_pass: float, tokens_full: float) -> bool:
        """Whether a step of history's drafts alone, expected to emit `tokens_first_pass`
        tokens, is expected to be faster than one with the draft model's (`tokens_full`);
        True while the first-pass path has not been timed (so it is)."""
        first, full = self.draft["first_pass"], self.draft["full"]
        if first is None or full is None or self.rest is None:
            return True
        return tokens_first_pass / (self.rest + first) >= tokens_full / (self.rest + full)


class DraftLengths:
    """Whether history drafting past the draft model's k (history.hybrid_max_draft) pays
    at a batch size, from measured tokens per second: a longer draft emits more tokens a
    step where history repeats, and costs a verifier forward over more tokens for every
    row that drafts long; a small batch's forward costs about the same for 4 tokens a row
    as for 9, a large one's does not (with long drafts always on, RL-Zero was faster than
    EAGLE-3 alone at c=1 and slower at c=64: docs/draft.md). Each engine step is
    attributed to the choice made when its drafts were made: the tokens it emitted over
    the time from that proposal to the next.
    A step counts as long if any row drafted past the model's k, whatever was chosen. Per
    batch size (powers of two), the choice with the higher moving average; each is tried
    where it has not been, and the other every REMEASURE_EVERY steps."""

    def __init__(self) -> None:
        self.rate: dict[tuple[int, bool], float] = {}
        self._since: dict[int, int] = {}  # steps since the other choice was tried, per size
        self._last: tuple[float, int, bool] | None = None  # (when, size, long) of the last proposal

    def observe(self, emitted: int, now: float, continued: bool) -> None:
        """`emitted`: tokens the step just verified emitted; `now`: its next proposal;
        `continued`: a request of the last proposal's step is still running (otherwise the
        engine may have waited idle in between)."""
        if self._last is not None and continued and now > self._last[0]:
            when, size, long = self._last
            self.rate[size, long] = _ema(self.rate.get((size, long)), emitted / (now - when))
        self._last = None

    def choose(self, batch: int) -> bool:
        """Whether this step's rows may draft from history past the draft model's k."""
        size = batch.bit_length()
        long, short = self.rate.get((size, True)), self.rate.get((size, False))
        if long is None or short is None:
            return long is None
        self._since[size] = self._since.get(size, 0) + 1
        if self._since[size] > REMEASURE_EVERY:
            self._since[size] = 0
            return long < short
        return long >= short

    def proposed(self, batch: int, now: float, long: bool) -> None:
        """A step of `batch` rows proposed its drafts at `now`, some row's past the draft
        model's k (`long`) or none (a step where no row had such a draft is a short one,
        whatever was chosen)."""
        self._last = (now, batch.bit_length(), long)


def _ema(average: float | None, x: float, decay: float = 0.9) -> float:
    return x if average is None else decay * average + (1 - decay) * x
