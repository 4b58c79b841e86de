"""The speculation methods specrl serves and what each needs, defined once for the
configs, the rollout engines, weight sync and the simulator."""

from __future__ import annotations

from typing import Literal

Method = Literal["none", "eagle3", "draft_model", "ngram", "history"]

# The longest draft a step may propose (num_speculative_tokens, the adaptive controller's
# largest k, the simulator's k).
MAX_SPECULATIVE_TOKENS = 16

# Methods that run a draft model of their own: it has weights to load and to publish
# (the draft-trainer's), unlike n-gram lookup.
DRAFT_MODEL_METHODS: frozenset[str] = frozenset({"eagle3", "draft_model"})


def has_draft_model(method: str) -> bool:
    return method in DRAFT_MODEL_METHODS
