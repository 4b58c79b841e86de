"""Speculation as the model sees it: how many tokens a verification step emits (from
per-position acceptance) and what the draft costs.

Speculative sampling is lossless: the emitted tokens follow the target's distribution
whatever the draft proposes, so acceptance changes only speed, never what is trained on.
Per-position acceptance a_i is the probability that draft token i is accepted given that
tokens 1..i-1 were; the acceptance length (tokens per verification step) is then
1 + sum_i prod_{j<=i} a_j."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.optimize import brentq

from specrl.sim.errors import SimError
from specrl.sim.models import ModelShape, eagle3_head, get_model
from specrl.speculation import MAX_SPECULATIVE_TOKENS, Method

# How EAGLE-3's conditional acceptance falls along the draft (position i+1's over
# position i's), fitted to the paper's k series (sim/validate.py, `specrl simulate
# validate`): what draft lengths other than a stated one are extrapolated with.
EAGLE3_DECAY = 0.525


class Speculation(BaseModel):
    """Draft method, draft length k and the per-position acceptance that goes with it."""

    model_config = ConfigDict(frozen=True)

    method: Method = "none"
    k: int = Field(0, ge=0, le=MAX_SPECULATIVE_TOKENS)
    acceptance: tuple[float, ...] = Field((), description="conditional acceptance per position, >= k")
    draft_model: str = Field("qwen3-0.6b", description="the external draft (method draft_model)")
    draft_vocab: int = Field(32000, gt=0, description="EAGLE-3's reduced output vocabulary")

    @model_validator(mode="after")
    def _consistent(self) -> Speculation:
        if (self.method == "none") != (self.k == 0):
            raise SimError(f"method {self.method!r} with k={self.k}: k is 0 exactly when method is 'none'")
        if len(self.acceptance) < self.k:
            raise SimError(f"k={self.k} needs at least {self.k} per-position acceptance values")
        if any(not 0.0 <= a <= 1.0 for a in self.acceptance):
            raise SimError(f"acceptance values must lie in [0, 1], got {list(self.acceptance)}")
        return self

    @classmethod
    def geometric(cls, method: Method, k: int, alpha: float, **kw: object) -> Speculation:
        """The same acceptance `alpha` at every position (the usual first model)."""
        return cls(method=method, k=k, acceptance=(alpha,) * k, **kw)

    @classmethod
    def from_acceptance_length(
        cls, method: Method, k: int, length: float, decay: float = 1.0, **kw: object
    ) -> Speculation:
        """Acceptance that gives the stated acceptance `length` at draft length k (the form
        in which papers report acceptance): a * decay^(i-1) at position i, a solved for
        (decay 1: the same at every position). Positions up to the longest draft are
        filled, so `with_k` extends a draft along the same decay."""
        if not 1.0 <= length <= k + 1:
            raise SimError(f"acceptance length {length} is outside [1, k+1] = [1, {k + 1}]")
        if not 0.0 < decay <= 1.0:
            raise SimError(f"acceptance decay must lie in (0, 1], got {decay}")
        a = decayed_alpha(k, length, decay)
        curve = tuple(min(1.0, a * decay**i) for i in range(max(k, MAX_SPECULATIVE_TOKENS)))
        return cls(method=method, k=k, acceptance=curve, **kw)

    @property
    def acceptance_length(self) -> float:
        return acceptance_length(self.acceptance[: self.k])

    def with_k(self, k: int) -> Speculation:
        """The same draft at another draft length (the last acceptance value extends)."""
        if k == 0:
            return Speculation()
        values = self.acceptance or (0.0,)
        extended = tuple(values[:k]) + (values[-1],) * max(0, k - len(values))
        return self.model_copy(update={"k": k, "acceptance": extended})

    def draft_shape(self, target: ModelShape) -> ModelShape | None:
        """The network each sequential draft forward runs (None: drafting costs nothing
        on the device, as for n-gram lookup)."""
        if self.method == "eagle3":
            return eagle3_head(target, self.draft_vocab)
        if self.method == "draft_model":
            return get_model(self.draft_model)
        return None


def parse_acceptance(
    method: Method, per_position: str | None, length: float | None, k: int = 3
) -> Speculation:
    """A draft from a user's inputs: conditional acceptance per position ("0.9,0.8,0.7", as
    vLLM's per-position counters measure it; the last value extends) or an acceptance
    length at draft length `k` (spread along EAGLE3_DECAY), not both; neither: acceptance
    length 3 at k=3 (the only EAGLE-3 value the paper states)."""
    if per_position is not None and length is not None:
        raise SimError("give per-position acceptance or an acceptance length, not both")
    if per_position is None:
        return Speculation.from_acceptance_length(method, k, 3.0 if length is None else length, EAGLE3_DECAY)
    try:
        values = tuple(float(v) for v in per_position.split(","))
    except ValueError:
        raise SimError(
            f"per-position acceptance must be comma-separated numbers, got {per_position!r}"
        ) from None
    if len(values) > MAX_SPECULATIVE_TOKENS:
        raise SimError(
            f"per-position acceptance has {len(values)} values; "
            f"drafts are at most {MAX_SPECULATIVE_TOKENS} long"
        )
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise SimError(f"per-position acceptance values must lie in [0, 1], got {per_position!r}")
    return Speculation(method=method, k=len(values), acceptance=values)


def acceptance_length(acceptance: tuple[float, ...] | list[float]) -> float:
    """1 + expected accepted draft tokens per verification step."""
    return 1.0 + float(np.sum(np.cumprod(np.asarray(acceptance, dtype=float))))


def decayed_alpha(k: int, length: float, decay: float = 1.0) -> float:
    """The first position's acceptance a for which acceptance a * decay^(i-1) at positions
    1..k gives `length` (decay 1: 1 + a + ... + a^k = length)."""
    if length <= 1.0:
        return 0.0

    def gap(a: float) -> float:
        return acceptance_length([min(1.0, a * decay**i) for i in range(k)]) - length

    top = decay ** -(k - 1)  # every position accepted
    if gap(top) <= 0:
        return top
    return float(brentq(gap, 0.0, top))
