"""Drafts from the run's own history (speculation method `history`): RL is not serving, the
same prompts come back every epoch and each is sampled n times a step, so the responses to
one prompt share long spans. For a request, the draft continues its last tokens where they
occurred before in the text of the same prompt: the prompt itself, the sibling samples of
the same request (in flight or finished) and earlier responses to the same prompt (earlier
steps and epochs, by whatever policy wrote them), kept per prompt up to
`max_sequences_per_prompt`, for at most `max_prompts` prompts and `max_tokens` tokens in
all (the least recently used prompts go first), dropped after `max_age` policy versions.

Each prompt's text is counted once. A response's sequence starts with a fixed boundary of
`max_depth + 1` sentinel ids (negative: no text holds them) where it used to start with a
copy of the prompt's last tokens: the trees are per prompt, so the boundary says as much
(a response's first tokens are found after it), and a copy in every sequence made the
prompt's tail outweigh the responses wherever a response quoted it (with 8 samples a
prompt and kept epochs, 64 copies: history drafted the prompt's continuation there; a
replay of the zoo target's responses, 2026-12-01, docs/draft.md). A request in flight
holds its newest token out of its tree until the next ones come (or it ends): the context
it drafts after always ends there, where its own sequence has no continuation, and that
end counted as one more suffix at every node it matches, halving a single earlier
response's share. Siblings in flight hold theirs back alike, so their text reaches the
others a step later (measured: docs/draft.md).

The text lives in native suffix trees, one per prompt: Arctic Inference's, the structure
vLLM's own suffix decoding (`method: suffix`) drafts from. vLLM's method keeps one tree
per running request and one global tree of every response, with no notion of prompt, no
policy version and no way to seed it; specrl keys the trees by prompt and keeps that
bookkeeping here. Measured on this machine's CPU (2026-11-27, 200 prompts x 8 responses of
300 tokens, depth 16): ~0.9 us and ~390 bytes (the tree's own estimate) per token kept,
~2.7 us per draft; the pure-Python index it replaced took ~8.5 us per token and ~46 us per
draft.

Matching (the tree's): for every length m from 1 to the context's, the node of the
context's last m tokens, followed along its most frequent continuation while the
product of the branch shares (the estimated probability of the draft token) stays at
least `min_token_prob`, for at most `max_spec_factor * m` tokens; the draft with the
highest sum of those probabilities wins. The tree holds `max_depth` tokens per suffix, so
a match and its draft together span at most `max_depth` tokens. A draft from a match
shorter than `min_match` tokens is not used.

The draft is lossless whatever history holds: the engine verifies it against the target
(rejection sampling of a deterministic draft), so history written by an older policy can
cost acceptance, never correctness (tests/integration/test_lossless.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ARCTIC_INFERENCE = "arctic-inference==0.3.0"  # scripts/setup.sh and the images build it


def suffix_tree_class() -> Any:
    """Arctic Inference's native suffix tree, or an error saying how to install it."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:
        raise RuntimeError(
            "drafting from history (speculation.method history, or speculation.history.hybrid) "
            f"needs Arctic Inference's suffix tree, which did not import ({e}): scripts/setup.sh "
            f"builds it; by hand: pip install --no-build-isolation {ARCTIC_INFERENCE} (needs "
            "setuptools, wheel, ninja, cmake, nanobind==2.9.2 and a C++20 compiler)"
        ) from e
    return SuffixTree


@dataclass
class _Sequence:
    length: int  # tokens held in the tree
    version: int  # the policy version that wrote it (the prompt's: when first seen)
    live: bool = True
    newest: int | None = None  # a live response's newest token, not in the tree yet


@dataclass
class _Prompt:
    """One prompt's text: the prompt (sequence 0) and responses, in one suffix tree."""

    tree: Any
    sequences: dict[int, _Sequence] = field(default_factory=dict)
    next_id: int = 0


class HistoryIndex:
    def __init__(
        self,
        *,
        min_match: int = 2,
        max_depth: int = 16,
        min_token_prob: float = 0.1,
        max_spec_factor: float = 1.0,
        max_sequences_per_prompt: int = 64,
        max_prompts: int = 4096,
        max_age: int = 8,
        max_tokens: int = 4_000_000,
    ) -> None:
        self._tree = suffix_tree_class()
        self.min_match, self.max_depth = min_match, max_depth
        self.min_token_prob, self.max_spec_factor = min_token_prob, max_spec_factor
        self.max_sequences_per_prompt, self.max_prompts, self.max_age = (
            max_sequences_per_prompt,
            max_prompts,
            max_age,
        )
        self.max_tokens = max_tokens
        self.tokens = 0  # kept, over every prompt
        self.version = 0  # the policy version being served
        self._prompts: OrderedDict[bytes, _Prompt] = OrderedDict()  # least recently used first
        # where every response's sequence starts (its context too, while shorter than the tree's depth)
        self._boundary = np.arange(-2 - max_depth, -1, dtype=np.int32)

    # -- what the engine tells it --------------------------------------------------------

    def start(self, key: bytes, prompt: Sequence[int]) -> int:
        """A request for prompt `key` begins: the id of its response sequence."""
        p = self._prompts.get(key)
        if p is None:
            p = self._prompts[key] = _Prompt(self._tree(self.max_depth))
            self._add(p, prompt)  # the prompt itself: lookup into it
        self._prompts.move_to_end(key)
        self._evict()
        seq = self._add(p, self._boundary[:-1])  # a response's first tokens: after the boundary
        p.sequences[seq].newest = int(self._boundary[-1])
        return seq

    def extend(self, key: bytes, seq: int, tokens: Sequence[int]) -> None:
        """Tokens the request's response grew by (its newest held back: see the module)."""
        p = self._prompts.get(key)
        s = p.sequences.get(seq) if p is not None else None
        if s is not None and s.live and len(tokens):
            held = np.empty(len(tokens), dtype=np.int32)  # the one held till now, all but the newest
            held[0], held[1:] = s.newest, tokens[:-1]
            self._append(p, seq, held)
            s.newest = int(tokens[-1])

    def finish(self, key: bytes, seq: int) -> None:
        """The request ended: its response stays as history of its prompt."""
        p = self._prompts.get(key)
        if p is not None and seq in p.sequences:
            ended = p.sequences[seq]
            self._append(p, seq, [ended.newest])
            ended.live, ended.newest = False, None
            done = [i for i, s in p.sequences.items() if i and not s.live]
            self._drop(p, done[: max(0, len(done) - self.max_sequences_per_prompt)])
            self._evict()

    def set_version(self, version: int) -> None:
        """The policy changed: responses started more than `max_age` versions ago are
        dropped, finished or not (the engine reports a request's end only at its next
        step, so the last requests before an update still look live; one that is really
        in flight drafts on from the rest of its prompt's history)."""
        self.version = version
        for p in self._prompts.values():
            self._drop(p, [i for i, s in p.sequences.items() if i and version - s.version > self.max_age])

    def finished(self, key: bytes) -> int:
        """Finished responses kept for prompt `key` (an earlier step's or epoch's, or
        carried with it), not counting those in flight."""
        p = self._prompts.get(key)
        return 0 if p is None else sum(1 for i, s in p.sequences.items() if i and not s.live)

    # -- drafting ---------------------------------------------------------------------

    def propose(
        self, key: bytes, seq: int, context: Sequence[int], response: int, k: int, min_depth: int = 0
    ) -> list[int]:
        """Up to `k` draft tokens after `context` (the request's last tokens, `max_depth + 1`
        at least where it has them, of which the last `response` are its response so far;
        a contiguous int32 array is passed to the tree without a copy) for its response
        sequence `seq`; [] when history has no match, or its draft comes from a match
        shorter than `min_depth` tokens (a confident match: the hybrid's test).

        A response still shorter than the tree's depth is matched from the boundary its
        sequence starts with; where that drafts fewer than `k` tokens, also across the
        prompt's end (the prompt's own text, where a response starts by quoting it: the
        zoo's RL-Zero answers restate the question), and the likelier draft is taken."""
        p = self._prompts.get(key)
        if p is None or k <= 0:
            return []
        # the tree matches at most len(context) - 1 tokens: one more than max_depth
        context = _int32(context[-self.max_depth - 1 :])
        own = min(response, len(context))
        args = (k, self.max_spec_factor, 0.0, self.min_token_prob, False)
        if own > self.max_depth:
            draft = p.tree.speculate_ndarray(context, *args)
        else:
            from_start = np.concatenate((self._boundary[own:], context[len(context) - own :]), dtype=np.int32)
            draft = p.tree.speculate_ndarray(from_start, *args)
            if len(draft.token_ids) < k and own < len(context):
                if len(context) <= self.max_depth:  # a token no sequence has, before it all
                    context = np.concatenate(([-1], context), dtype=np.int32)
                across = p.tree.speculate_ndarray(context, *args)
                if across.score > draft.score:
                    draft = across
        if draft.match_len < max(self.min_match, min_depth):
            return []
        return list(draft.token_ids)

    # -- bookkeeping ------------------------------------------------------------------

    def _add(self, p: _Prompt, tokens: Sequence[int]) -> int:
        """A sequence of `tokens` (the prompt's, finished; a response's, live)."""
        seq = p.next_id
        p.next_id += 1
        p.sequences[seq] = _Sequence(0, self.version, live=seq > 0)
        self._append(p, seq, tokens)
        return seq

    def _append(self, p: _Prompt, seq: int, tokens: Sequence[int]) -> None:
        if len(tokens):
            p.tree.extend_ndarray(seq, _int32(tokens))
            p.sequences[seq].length += len(tokens)
            self.tokens += len(tokens)

    def _evict(self) -> None:
        """Over `max_prompts` or `max_tokens`: the least recently started prompts go
        (never the most recent one)."""
        while len(self._prompts) > 1 and (
            len(self._prompts) > self.max_prompts or self.tokens > self.max_tokens
        ):
            _, p = self._prompts.popitem(last=False)
            self.tokens -= sum(s.length for s in p.sequences.values())

    def _drop(self, p: _Prompt, sequences: list[int]) -> None:
        for i in sequences:
            p.tree.remove(i)
            self.tokens -= p.sequences.pop(i).length


def _int32(tokens: Sequence[int]) -> np.ndarray:
    """Token ids as the trees take them: the batch's contiguous int32 rows as they are (no
    copy), anything else converted."""
    return np.ascontiguousarray(tokens, dtype=np.int32)
