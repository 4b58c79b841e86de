"""Which source drafts a request's next step in the hybrid (speculation.history.hybrid:
history or the draft model), chosen by what each has been accepted at on that request.

Both sources draft deterministically, and for a deterministic draft the verifier accepts
token x with probability p(x), the probability that the policy samples x. The tokens a
step emits are samples of the policy (that is what lossless means), so any deterministic
draft of the step can be scored against them, not only the one that was verified: its
leading tokens that agree with the emitted ones are distributed as its accepted tokens
would have been (censored at the tokens emitted: the accepted ones and one more). So
every step scores every draft a source made for it, chosen or not, and a request's next
draft comes from the source whose recent drafts agreed most (SourceScores). Ties go to
history, which costs no draft-model forwards when every request of a step takes it.

A request starts from the replica's running scores: a new request on a prompt whose
history drafts well starts trusting history, and a weak draft model is left behind after
its first steps, a strong one kept.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

SOURCES = ("history", "model")
DECAY = 0.5  # a request's score: its last few steps (a span repeated, or not)
PRIOR_DECAY = 0.95  # the replica's scores, where a request starts


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
    tokens emitted after them; the replica's own over every request as the start."""

    def __init__(self) -> None:
        self.prior = dict.fromkeys(SOURCES, 0.0)
        self._scores: dict[str, dict[str, float]] = {}
        self._offered: dict[str, dict[str, list[int]]] = {}

    def score(self, req: str, emitted: Sequence[int]) -> None:
        """The tokens `req`'s last step emitted: every draft offered for it is scored."""
        scores = self._scores.setdefault(req, dict(self.prior))
        for source, draft in self._offered.pop(req, {}).items():
            n = agreed(draft, emitted)
            scores[source] = DECAY * scores[source] + (1 - DECAY) * n
            self.prior[source] = PRIOR_DECAY * self.prior[source] + (1 - PRIOR_DECAY) * n

    def offer(self, req: str, source: str, draft: Sequence[int]) -> None:
        """`source` drafted `draft` for `req`'s next step (verified or not)."""
        self._offered.setdefault(req, {})[source] = list(draft)

    def prefers_history(self, req: str) -> bool:
        scores = self._scores.get(req, self.prior)
        return scores["history"] >= scores["model"]

    def retain(self, reqs: Collection[str]) -> None:
        """Forget the requests not in `reqs` (they ended)."""
        for table in (self._scores, self._offered):
            for req in table.keys() - reqs:
                del table[req]
