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
model's positions is a question of tokens per second (StepCosts). The draft model's draft
may go on with history's tokens after it (an extension: scored as the model's draft, its
own tokens first; its positions are reached only where every one of the model's agreed).

A request starts from the replica's running scores: a new request on a prompt whose
history drafts well starts trusting history, and a weak draft model is left behind after
its first steps, a strong one kept. What the rows then emitted checks the choice per kind
of request (Realized): among many requests some read history better by chance, and a
kind whose rows did worse on history's drafts than on the model's stops taking them for
a while.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

SOURCES = ("history", "model")
# a request's kind: "recurring" where its prompt had finished responses when it began (an
# earlier epoch's, or carried with it), else "fresh" (the prompt and its siblings only).
# Each kind keeps its own replica-level scores and taken share (ByKind): history drafts
# the two very differently (RL-Zero on the CPU testbed: ~2.4 tokens a step from siblings
# alone, ~6 from an earlier epoch's responses), so a server kept across a run's epochs
# judged its second epoch's requests by its first epoch's: they started quiet, on the
# padded path, and took history's drafts steps late (docs/draft.md)
KINDS = ("fresh", "recurring")
DECAY = 0.5  # a request's score: its last few steps (a span repeated, or not)
PRIOR_DECAY = 0.95  # the replica's scores, where a request starts
RUN_DECAY = 0.8  # a request's acceptance rate: about its last 5 drafts
RUN_START = (1 - PRIOR_DECAY) / (1 - RUN_DECAY)  # the replica's rate, weighted as 5 drafts
# how often a draft position is accepted once the one before it was, per position over
# the replica's drafts (about their last 500); a request's first position over its own
# last few drafts (RUN_DECAY), the replica's as DEPTH_PRIOR drafts' worth
DEPTH_DECAY = 0.998
DEPTH_PRIOR = 4.0
# the drafts whose lengths are chosen per position (draft_lengths): history's, and history's
# tokens after the draft model's k ("extension": SourceScores.score), the draft model
# drafting its k; no per-position counts are kept for the others
DEPTH_SOURCES = ("history", "extension")
# steps in a row that every request drafts from history (the draft model's first pass
# only) before one where the draft model drafts too and is measured again (its weights
# may have been updated since)
REMEASURE_EVERY = 16
# a request whose history drafts were not taken QUIET_AFTER steps in a row (none offered,
# or the draft model's preferred) is looked up in history, and its drafts scored, only
# every PROBE_EVERY steps (looks_up): where history has nothing to add (a first epoch, new
# prompts) that is work for nothing (RL-Think epoch 0, c=64 on the CPU testbed: about half
# the rows skipped, the hybrid's own work 1.4-1.8 ms a step against 2.0-2.3). Its tokens
# still go into the tree every step: its siblings draft from them.
QUIET_AFTER = 8
PROBE_EVERY = 4
# a replica where under its idle share (history.hybrid_idle_share) of the rows took
# history's draft over about its last 50 steps (SHARE_DECAY; IDLE_ROWS rows at least)
# starts each new request as quiet: looked up on its first step, then every PROBE_EVERY
# steps until a draft of history's is taken. Where responses are short (RL-Zero's ~13
# steps on the testbed) a request's own count hardly reaches QUIET_AFTER, yet at its
# first epoch 1-4% of the rows took history's draft
SHARE_DECAY = 0.98
IDLE_ROWS = 64.0
# steps an idle replica runs on vLLM's padded drafter path (the draft model alone, as
# EAGLE-3 alone runs) after one of its steps in which no row took history's draft; the
# unpadded step after them looks history up again. At epoch 0, c=64 on the CPU testbed
# an unpadded step emitted 13-24% fewer tokens a ms than a padded one, and with 3 padded
# steps between lookups 34-41% of the steps of 30 rows or more were unpadded (three
# runs, logged ad hoc); a request's first lookup waits at most this many steps
IDLE_PADDED_STEPS = 15
# A kind of request whose rows emitted fewer tokens a row after taking history's draft
# than after the draft model's, over about their last 50 rows each (REALIZED_DECAY;
# REALIZED_ROWS of each at least), takes history's drafts no more for RETRY_AFTER of its
# steps, then measures them afresh (Realized). A request's own scores choose history
# where they read it at least as good, and among many requests some read so by chance
# and disappoint (the maximum of two noisy estimates is biased up): at RL-Zero's epoch 0,
# c=4 on the CPU testbed, rows that took history's (siblings') drafts emitted 2.8-3.0
# tokens against the draft model's rows' 3.6 (logged ad hoc), the hybrid 3.44-3.59
# tokens a step against EAGLE-3 alone's 3.70-3.72; 3.69-3.70 with this check. Rows are
# counted alike whatever their step cost: with each history row weighed by its step's
# whole seconds over a padded step's (tried in 62504c6), the hybrid at c=64 from RL-Zero's
# second epoch took history's drafts on 43-51% of its rows against 79-86% and accepted
# 4.4-4.8 tokens a step against 6.2-6.7, where history alone accepts 6.0-6.5 (a full
# batch's step was judged against padded steps of every size; docs/draft.md).
REALIZED_DECAY = 0.98
REALIZED_ROWS = 16.0
RETRY_AFTER = 256


def looks_up(quiet: int) -> bool:
    """Whether a request whose history drafts were not taken `quiet` steps in a row is
    looked up in history this step (QUIET_AFTER)."""
    return quiet < QUIET_AFTER or (quiet - QUIET_AFTER) % PROBE_EVERY == 0


class TakenShare:
    """The share of a replica's rows that took history's draft, over its last steps
    (SHARE_DECAY): under `idle_share`, the replica is idle, and a new request's quiet
    count starts at QUIET_AFTER."""

    def __init__(self, idle_share: float = 0.1) -> None:
        self.idle_share = idle_share
        self.taken = self.rows = 0.0

    def observe(self, taken: int, rows: int) -> None:
        self.taken = SHARE_DECAY * self.taken + taken
        self.rows = SHARE_DECAY * self.rows + rows

    @property
    def idle(self) -> bool:
        return self.rows >= IDLE_ROWS and self.taken < self.idle_share * self.rows

    def quiet_start(self) -> int:
        return QUIET_AFTER if self.idle else 0


def agreed(draft: Sequence[int], emitted: Sequence[int]) -> int:
    """Leading tokens of `draft` that the step emitted too (module docstring)."""
    n = 0
    for d, e in zip(draft, emitted):
        if d != e:
            break
        n += 1
    return n


@dataclass
class Prior:
    """A source's scores over a replica's requests, where a new request's start
    (PRIOR_DECAY): its tokens agreed, and its (agreed, refused) draft tokens."""

    score: float = 0.0
    runs: list[float] = field(default_factory=lambda: [0.0, 0.0])


class SourceScores:
    """Per request, a moving average of the tokens each source's drafts agreed with the
    tokens emitted after them, and each source's acceptance rate per draft position (its
    own tokens agreed over those agreed and those refused: the estimate of a geometric
    rate from censored runs, a run cut by the tokens emitted or the draft's end refusing
    nothing); the replica's own over every request as the start (`priors`, per source:
    a Prior, shared with another kind's scores or its own). An offer is scored only
    against the step right after it (`at`: the request's tokens when it was offered; a
    step the drafter skipped would misalign them)."""

    def __init__(
        self, measured: dict[str, int] | None = None, priors: dict[str, Prior] | None = None
    ) -> None:
        self.priors = priors or {source: Prior() for source in SOURCES}
        # drafts scored, over the replica (`measured`: shared with other kinds' scores)
        self.measured = dict.fromkeys(SOURCES, 0) if measured is None else measured
        self._scores: dict[str, dict[str, float]] = {}
        self._runs: dict[str, dict[str, list[float]]] = {}
        self._offered: dict[str, tuple[int, dict[str, tuple[list[int], int]]]] = {}
        # per source and draft position: (drafts that kept it, drafts that reached it),
        # decayed; kept undecayed, each draft weighted by `_weight` (1 / DEPTH_DECAY per
        # draft), and divided by it when read: no pass over the positions per draft
        self._depth: dict[str, list[list[float]]] = {source: [[], []] for source in DEPTH_SOURCES}
        self._weight = dict.fromkeys(DEPTH_SOURCES, 1.0)
        self._first: dict[str, dict[str, list[float]]] = {}  # per request and source: the same at 1

    def score(self, req: str, emitted: Sequence[int], at: int) -> None:
        """The tokens `req`'s last step emitted, `at` its tokens now: every draft offered
        for that step is scored."""
        offered = self._offered.pop(req, None)
        if offered is None or offered[0] != at - len(emitted):
            return
        drafts = offered[1]
        scores, runs = self._scores.get(req), self._runs.get(req)
        if scores is None:
            scores = self._scores[req] = self.prior
        if runs is None:
            runs = self._runs[req] = {s: [RUN_START * v for v in self.priors[s].runs] for s in SOURCES}
        for source, (draft, own) in drafts.items():
            n = agreed(draft, emitted)
            prior = self.priors[source]
            scores[source] = DECAY * scores[source] + (1 - DECAY) * n
            prior.score = PRIOR_DECAY * prior.score + (1 - PRIOR_DECAY) * n
            self.measured[source] += 1
            seen = min(own, len(emitted))  # its own positions the tokens emitted cover
            run = (min(n, own), float(n < seen))
            for total, decay in ((runs[source], RUN_DECAY), (prior.runs, PRIOR_DECAY)):
                total[:] = [decay * t + x for t, x in zip(total, run)]
            if source in self._depth:
                self._score_depth(req, source, n, seen)
            elif own < len(draft) and n >= own and len(emitted) > own:
                # history's tokens after the model's own (an extension): its positions were
                # reached where every one of the model's agreed
                self._score_depth(req, "extension", n - own, min(len(draft), len(emitted)) - own)

    def _score_depth(self, req: str, source: str, n: int, seen: int) -> None:
        """A draft of `req` whose first `n` tokens agreed, `seen` of its own positions
        observed: position j was reached when the j - 1 before it agreed, and kept when it
        agreed too (over the replica; the first position over `req`'s drafts too)."""
        if seen:
            first = self._first.setdefault(req, {}).setdefault(source, [0.0, 0.0])
            first[:] = [RUN_DECAY * first[0] + float(n > 0), RUN_DECAY * first[1] + 1.0]
        kept, reached = self._depth[source]
        w = self._weight[source] = self._weight[source] / DEPTH_DECAY
        if w > 1e100:  # renormalise before the weights overflow
            for counts in (kept, reached):
                counts[:] = [c / w for c in counts]
            w = self._weight[source] = 1.0
        for counts in (kept, reached):
            counts.extend([0.0] * (seen - len(counts)))
        for j in range(min(n + 1, seen)):  # 0-based: positions 1 .. n + 1 were reached
            reached[j] += w
            if j < n:
                kept[j] += w

    def offer(self, req: str, source: str, draft: Sequence[int], at: int, own: int | None = None) -> None:
        """`source` drafted `draft` for `req`'s next step (verified or not), `at` the
        request's tokens so far; `own`: its leading tokens that are the source's own (the
        rest filled by the other source; None: all)."""
        offered_at, drafts = self._offered.setdefault(req, (at, {}))
        if offered_at != at:  # left over from a step that was not scored
            self._offered[req] = offered_at, drafts = at, {}
        drafts[source] = list(draft), len(draft) if own is None else own

    @property
    def prior(self) -> dict[str, float]:
        """Each source's tokens agreed over the replica's requests (a new request's)."""
        return {source: prior.score for source, prior in self.priors.items()}

    def expected(self, req: str) -> dict[str, float]:
        """Tokens each source's next draft for `req` is expected to have accepted."""
        return self._scores.get(req) or self.prior

    def acceptance(self, req: str, source: str) -> float:
        """The rate at which `source`'s draft tokens are accepted on `req`, position by
        position (0 before any was scored)."""
        runs = self._runs.get(req)
        agreed_, refused = runs[source] if runs else self.priors[source].runs
        return agreed_ / (agreed_ + refused) if agreed_ + refused else 0.0

    def position_acceptance(self, req: str, source: str, longest: int) -> list[float]:
        """The probability that each of positions 1 .. `longest` of `source`'s (one of
        DEPTH_SOURCES) next draft for `req` is accepted (it and every one before it): how
        often the request's own recent drafts were accepted at their first position (the
        replica's rate there as a prior), then, position by position, how often the
        replica's drafts kept a position they reached (the request's per-token rate,
        `acceptance`, where the replica has few). Not one per-token rate to the power of
        the position: a history draft that starts right tends to run far (a response
        repeating a span of an earlier one; in RL-Zero's second epoch on the CPU testbed,
        drafts that reached positions 3-5 kept them 97-100% of the time, those reaching
        1-2 94%), and a per-token rate averages the two."""
        # an extension's positions, before the replica has kept any: as the model's before them
        rate = self.acceptance(req, "model" if source == "extension" else source)
        kept, reached = self._depth[source]
        w = self._weight[source]

        def kept_once_reached(j: int, prior: float) -> float:
            k, n = (kept[j] / w, reached[j] / w) if j < len(kept) else (0.0, 0.0)
            return (k + DEPTH_PRIOR * prior) / (n + DEPTH_PRIOR)

        mine_kept, mine = self._first.get(req, {}).get(source, (0.0, 0.0))
        p = (mine_kept + DEPTH_PRIOR * kept_once_reached(0, rate)) / (mine + DEPTH_PRIOR)
        out = [p]
        for j in range(1, longest):
            p *= kept_once_reached(j, rate)
            out.append(p)
        return out[:longest]

    def extension_acceptance(self, req: str, own: int, longest: int) -> list[float]:
        """The probability that each of positions 1 .. `longest` of history's extension of
        the draft model's `own`-token draft for `req` is accepted: every one of the model's
        (its per-token rate on `req`, to the power `own`), then the extension's
        (position_acceptance)."""
        whole = self.acceptance(req, "model") ** own
        return [whole * p for p in self.position_acceptance(req, "extension", longest)]

    def prefers_history(self, req: str) -> bool:
        if not self.measured["model"]:  # never measured here: it drafts, and is measured
            return False
        scores = self.expected(req)
        return scores["history"] >= scores["model"]

    def retain(self, reqs: Collection[str]) -> None:
        """Forget the requests not in `reqs` (they ended)."""
        for table in (self._scores, self._runs, self._offered, self._first):
            for req in table.keys() - reqs:
                del table[req]


class Realized:
    """What a kind's rows emitted, per source of the draft they took: exponentially
    weighted tokens a row over rows (REALIZED_DECAY). Where history's rows emitted fewer
    than the draft model's, each over REALIZED_ROWS rows at least, the kind is closed to
    history's drafts for RETRY_AFTER steps (its requests' own scores read history better
    by chance: see REALIZED_DECAY), then opened with history's rows forgotten, to be
    measured again."""

    def __init__(self) -> None:
        self.tokens = dict.fromkeys(SOURCES, 0.0)
        self.rows = dict.fromkeys(SOURCES, 0.0)
        self.closed_for = 0  # steps left closed

    def observe(self, source: str, emitted: int) -> None:
        """A row drafted by `source` emitted `emitted` tokens (closing the kind where
        history's rows now read worse)."""
        self.tokens[source] = REALIZED_DECAY * self.tokens[source] + emitted
        self.rows[source] = REALIZED_DECAY * self.rows[source] + 1.0
        if (
            self.open
            and min(self.rows.values()) >= REALIZED_ROWS
            and self.per_row("history") < self.per_row("model")
        ):
            self.closed_for = RETRY_AFTER

    def per_row(self, source: str) -> float:
        return self.tokens[source] / self.rows[source] if self.rows[source] else 0.0

    def step(self) -> None:
        """One of the kind's steps went by (counts its closed steps down)."""
        if self.closed_for:
            self.closed_for -= 1
            if not self.closed_for:
                self.tokens["history"] = self.rows["history"] = 0.0

    @property
    def open(self) -> bool:
        """Whether the kind's rows may take history's drafts."""
        return not self.closed_for


class ByKind:
    """SourceScores, TakenShare and Realized per kind of request (KINDS), `kind_of`
    telling a request's; whether the draft model was ever measured is the replica's, and
    so are its scores where a request starts (one Prior: it drafts a request alike
    whatever its prompt's history). With a prior of its own per kind, a server kept into
    a run's second epoch started its recurring requests with the model's score at 0 and
    took history's drafts at a tie of nothing (RL-Think, c=4 on the CPU testbed: 0.91x
    EAGLE-3 alone at the second epoch, where history alone ran 0.85x; logged ad hoc)."""

    def __init__(self, kind_of: Callable[[str], str], idle_share: float = 0.1) -> None:
        self.kind_of = kind_of
        measured = dict.fromkeys(SOURCES, 0)
        model = Prior()
        self.scores = {kind: SourceScores(measured, {"history": Prior(), "model": model}) for kind in KINDS}
        self.shares = {kind: TakenShare(idle_share) for kind in KINDS}
        self.realized = {kind: Realized() for kind in KINDS}
        self.measured = measured

    def of(self, req: str) -> SourceScores:
        """The scores `req` is judged by: its kind's."""
        return self.scores[self.kind_of(req)]

    def share(self, req: str) -> TakenShare:
        return self.shares[self.kind_of(req)]

    def open(self, req: str) -> bool:
        """Whether `req`'s kind may take history's drafts (Realized)."""
        return self.realized[self.kind_of(req)].open

    def retain(self, reqs: Collection[str]) -> None:
        for scores in self.scores.values():
            scores.retain(reqs)

    def observe(self, took: Collection[str], live: Collection[str]) -> None:
        """A step's rows (`live`) and those that took history's draft, per kind (a step
        of each kind with rows in it, for Realized's count of closed steps)."""
        counts = {kind: [0, 0] for kind in KINDS}  # taken, rows
        for req in live:
            count = counts[self.kind_of(req)]
            count[0] += req in took
            count[1] += 1
        for kind, (taken, rows) in counts.items():
            if rows:
                self.shares[kind].observe(taken, rows)
                self.realized[kind].step()

    def idle(self, live: Collection[str]) -> bool:
        """Whether the kind of every request in `live` is idle (TakenShare)."""
        return all(self.share(req).idle for req in live)


class StepCosts:
    """Moving averages of an engine step's seconds: outside the draft model (`rest`: the
    target's forward, sampling, bookkeeping, history's lookup) and of the draft model's
    work by path (`full`: all k positions; `first_pass`: its first pass only, timed in
    steps of the full path too, to its first forward's end; `no_pass`:
    a step of history alone whose every row is left out of the draft model's pass, whose
    seconds are the runner's around a pass of no rows, timed apart so that they neither
    drag the first pass's average down nor are judged by it). Whether a
    step should draft from history alone, skipping the draft model's k - 1 sequential
    positions, is a question of tokens per second, not of tokens alone: a history draft a
    little worse than the model's, or none for a row or two, still pays when it saves the
    model's forwards (small batches, where a forward costs the same for 1 row as for 4)."""

    def __init__(self) -> None:
        self.rest: float | None = None
        self.draft: dict[str, float | None] = {"full": None, "first_pass": None, "no_pass": None}

    def observe(self, path: str, draft_s: float, rest_s: float | None) -> None:
        self.draft[path] = _ema(self.draft[path], draft_s)
        if rest_s is not None:
            self.rest = _ema(self.rest, rest_s)

    def first_pass_pays(
        self,
        tokens_first_pass: float,
        tokens_full: float,
        rest: tuple[float, float] | None = None,
        path: str = "first_pass",
    ) -> bool:
        """Whether a step of history's drafts alone, expected to emit `tokens_first_pass`
        tokens, is expected to be faster than one with the draft model's (`tokens_full`);
        `rest`: each path's seconds outside the draft model where known (VerifyCost's fit
        at the tokens each would verify: in a large batch history's drafts and the
        model's do not cost the same to verify), else the average step's; `path`: history
        alone's (`first_pass`, or `no_pass` where no row would be in the pass); True while
        a path has not been timed (so it is)."""
        first, full = self.draft[path], self.draft["full"]
        rest_first, rest_full = rest or (self.rest, self.rest)
        if first is None or full is None or rest_first is None or rest_full is None:
            return True
        return tokens_first_pass / (rest_first + first) >= tokens_full / (rest_full + full)


class Line(NamedTuple):
    """VerifyCost's fit at a row count: a step's seconds outside the draft model and its
    verified tokens (`base`), what one more verified token adds (`per_token`), and whether
    that slope is resolved (at least twice its standard error)."""

    base: float
    per_token: float
    resolved: bool

    def at(self, verified: float) -> float:
        """A step's seconds outside the draft model at `verified` tokens."""
        return self.base + self.per_token * verified


class VerifyCost:
    """What verifying one more draft token adds to an engine step, fitted to the steps as
    they run: the step's seconds outside the draft model (the target's forward over the
    verified tokens, sampling, bookkeeping) against the rows it ran and the tokens it
    verified (each row's sampled token and its draft), rest = a + r * rows + b * verified,
    by least squares over recent steps (exponentially weighted). A small batch's forward
    costs about the same for 4 tokens a row as for 9 (b small), a large one's does not.
    The rows are a term of their own where they vary (a large batch's tail): a row's
    sampling and bookkeeping grow with the rows, and so do the tokens, so a fit on the
    tokens alone reads per-row costs as per-token ones and cuts history's drafts short.
    Unknown (None) until MIN_STEPS steps have been timed whose token counts spread by a
    token at least beyond what the rows explain (a step or two of another size among many
    alike draws the line through themselves: at c=1 on the CPU testbed one step of 7
    tokens among a hundred of 4 had fitted 3 ms a token where a step costs as much for 9
    tokens as for 4), where the slope is not positive (more tokens costing less is noise),
    or where the fit puts a step's cost outside the verified tokens at or below zero (a
    line extrapolated past the steps it saw, whose per-token cost is then the whole step's:
    at c=64 on the CPU testbed such fits cut history's drafts to the model's k).

    A slope under twice its standard error is not `resolved`. How far history drafts
    (draft_lengths) takes resolved slopes only: noise about no cost would cut its drafts
    short, and drafting as far as history offers gives the fit steps of different token
    counts. Which path a step takes (StepCosts.first_pass_pays) takes any: there the slope
    weighs the draft model's k tokens a row against history's fewer, and none is the one
    guess known to be wrong. At c=64 on the CPU testbed (RL-Zero from epoch 1, steps of
    40-64 rows, two logged runs) 19 of 41 and 36 of 45 steps had a slope that was not
    resolved, reading 0.04-0.10 ms a token (the resolved ones 0.08-0.12); with no fit
    there, the path choice had timed the draft model's ~44 extra tokens a step as free."""

    MIN_STEPS = 8
    MIN_SPREAD = 1.0  # tokens: the verified tokens' (weighted) standard deviation, given the rows
    MIN_ROW_SPREAD = 1.0  # rows: the rows' (weighted) standard deviation, for their own term
    DECAY = 0.98  # about the last 50 steps

    def __init__(self) -> None:
        self.steps = 0
        self._moments = np.zeros((4, 4))  # weighted sums of [1, rows, verified, rest] x the same

    def observe(self, rest_s: float, rows: int, verified: int) -> None:
        x = np.array([1.0, float(rows), float(verified), rest_s])
        self._moments = self.DECAY * self._moments + np.outer(x, x)
        self.steps += 1

    def fit(self, rows: int) -> Line | None:
        """rest = a + r * rows + b * verified at `rows` rows, as Line(a + r * rows, b,
        resolved), or None (class docstring)."""
        m = self._moments
        n = m[0, 0]
        if self.steps < self.MIN_STEPS or n <= 0:
            return None
        row_var = m[1, 1] / n - (m[1, 0] / n) ** 2
        terms = [0, 1, 2] if row_var >= self.MIN_ROW_SPREAD**2 else [0, 2]
        xtx, xty = m[np.ix_(terms, terms)], m[terms, 3]
        try:
            inverse = np.linalg.inv(xtx)
        except np.linalg.LinAlgError:
            return None
        # 1 / inverse[v, v]: n x the verified tokens' variance left once the rows explain theirs
        if 1.0 / inverse[-1, -1] < n * self.MIN_SPREAD**2:
            return None
        beta = inverse @ xty
        residual = max(0.0, m[3, 3] - beta @ xty) / max(n - len(terms), 1.0)  # per step, weighted
        b = float(beta[-1])
        base = float(beta[0] + (beta[1] * rows if len(terms) == 3 else 0.0))
        if b <= 0 or base <= 0:  # no step costs less than nothing outside its tokens: past what it saw
            return None
        return Line(base, b, bool(b >= 2 * np.sqrt(residual * inverse[-1, -1])))


def draft_lengths(
    rows: list[tuple[Sequence[float], int, int]], tokens: float, seconds: float, per_token: float
) -> list[int]:
    """How far each history-drafted row drafts: `rows` holds (the probability that each
    of its draft positions is accepted, non-increasing: SourceScores.position_acceptance;
    the length it drafts anyway; the longest history offers), `tokens` and `seconds` the
    step's expected tokens and time at those lengths, `per_token` what a verified token
    adds (VerifyCost). Draft position j is accepted with probability p_j at the cost of
    one more verified token; a step emits the most tokens per second when exactly the
    positions with p_j x seconds >= per_token x tokens are drafted, its own tokens and
    seconds with them: a threshold that depends on the choice, so it is iterated to the
    fixed point (Dinkelbach's method for a ratio, which converges in a few rounds). A
    position nothing accepts is never drafted, even where verifying is free."""
    lengths = [short for _, short, _ in rows]
    total_tokens, total_seconds = tokens, seconds
    for _ in range(8):
        chosen = []
        for probs, short, longest in rows:
            m = short
            while m < longest and probs[m] > 0 and probs[m] * total_seconds >= per_token * total_tokens:
                m += 1
            chosen.append(m)
        if chosen == lengths:
            break
        lengths = chosen
        gain = sum(probs[j] for (probs, short, _), m in zip(rows, lengths) for j in range(short, m))
        extra = sum(m - short for (_, short, _), m in zip(rows, lengths))
        total_tokens, total_seconds = tokens + gain, seconds + per_token * extra
    return lengths


def _ema(average: float | None, x: float, decay: float = 0.9) -> float:
    return x if average is None else decay * average + (1 - decay) * x
