"""The speculation methods specrl serves and what each needs, defined once for the
configs, the rollout engines, weight sync and the simulator."""

from __future__ import annotations

from typing import Literal

Method = Literal["none", "eagle3", "draft_model", "ngram", "history"]

# The longest draft a step may propose (num_speculative_tokens, the adaptive controller's
# largest k, the simulator's k).
MAX_SPECULATIVE_TOKENS = 16
# History's longest draft where nothing else says (history alone's k in `bench history`, the
# hybrid's history.hybrid_max_draft there and in `bench step`'s hybrid run): a lookup, not
# a sequential forward, so the draft model's k does not limit it; how far each row drafts
# is then chosen per step (rollout/hybrid.py draft_lengths).
HISTORY_DRAFT = 8

# Methods that run a draft model of their own: it has weights to load and to publish
# (the draft-trainer's), unlike n-gram lookup.
DRAFT_MODEL_METHODS: frozenset[str] = frozenset({"eagle3", "draft_model"})


def has_draft_model(method: str) -> bool:
    return method in DRAFT_MODEL_METHODS
