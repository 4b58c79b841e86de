"""Drafts from the run's own history (speculation method `history`): RL is not serving, the
same prompts come back every epoch and each is sampled n times a step, so the responses to
one prompt share long spans. For a request, the draft continues its last tokens where they
occurred before in the text of the same prompt: the prompt itself, the sibling samples of
the same request (in flight or finished) and earlier responses to the same prompt (earlier
steps and epochs, by whatever policy wrote them), kept per prompt up to
`max_sequences_per_prompt`, for at most `max_prompts` prompts and `max_tokens` tokens in
all (the least recently used prompts go first), dropped after `max_age` policy versions.

Its cost, measured on this machine's CPU (one run, 2026-11-27): ~306 bytes and ~8.5 us per
token kept (Python lists and an n-gram dict), ~46 us per draft (16-token context, 960k
tokens held). Fine for the zoo; at 30k-token generations and hundreds of sequences a step
a native structure is needed (vLLM's suffix decoding uses Arctic Inference's C++ suffix
tree; docs/draft.md).

The draft is lossless whatever history holds: the engine verifies it against the target
(rejection sampling of a deterministic draft), so history written by an older policy can
cost acceptance, never correctness (tests/integration/test_lossless.py).

Matching: every position of every sequence is indexed by the `min_match` tokens before it
(a response's first positions by the prompt's last tokens);
the candidates for a context are the positions whose preceding tokens agree with it
longest (up to `max_depth`, at most MAX_CANDIDATES of the most recent are compared); the
draft then follows them token by token, taking the continuation most of them share and
keeping only the candidates that agree, while that continuation has at least `min_share`
of the candidates left.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_CANDIDATES = 64  # positions compared per draft, the most recent first


@dataclass
class _Sequence:
    tokens: list[int]
    version: int  # the policy version that wrote it (the prompt's: when first seen)
    live: bool = True


@dataclass
class _Prompt:
    """One prompt's text: the prompt (sequence 0) and responses, with their index."""

    sequences: dict[int, _Sequence] = field(default_factory=dict)
    index: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict)
    next_id: int = 0
    stale: int = 0  # index entries of dropped sequences (skipped; compacted when many)


class HistoryIndex:
    def __init__(
        self,
        *,
        min_match: int = 2,
        max_depth: int = 16,
        min_share: float = 0.3,
        max_sequences_per_prompt: int = 64,
        max_prompts: int = 4096,
        max_age: int = 8,
        max_tokens: int = 4_000_000,
    ) -> None:
        self.min_match, self.max_depth, self.min_share = min_match, max_depth, min_share
        self.max_sequences_per_prompt, self.max_prompts, self.max_age = (
            max_sequences_per_prompt,
            max_prompts,
            max_age,
        )
        self.max_tokens = max_tokens
        self.tokens = 0  # kept, over every prompt
        self.version = 0  # the policy version being served
        self._prompts: OrderedDict[bytes, _Prompt] = OrderedDict()  # least recently used first

    # -- what the engine tells it --------------------------------------------------------

    def start(self, key: bytes, prompt: Sequence[int]) -> int:
        """A request for prompt `key` begins: the id of its response sequence."""
        p = self._prompts.get(key)
        if p is None:
            p = self._prompts[key] = _Prompt()
            self._add(p, list(prompt), live=False)  # the prompt itself: lookup into it
        self._prompts.move_to_end(key)
        self._evict()
        seq = self._add(p, [], live=True)
        # the response continues the prompt: its first tokens are found by the prompt's
        # last ones (not indexed again themselves: the prompt's sequence holds them)
        p.sequences[seq].tokens = [int(t) for t in prompt[-self.max_depth :]]
        self.tokens += len(p.sequences[seq].tokens)
        return seq

    def extend(self, key: bytes, seq: int, tokens: Sequence[int]) -> None:
        """Tokens the request's response grew by."""
        p = self._prompts.get(key)
        if p is not None and seq in p.sequences:
            self._append(p, seq, tokens)

    def finish(self, key: bytes, seq: int) -> None:
        """The request ended: its response stays as history of its prompt."""
        p = self._prompts.get(key)
        if p is not None and seq in p.sequences:
            p.sequences[seq].live = False
            self._trim(p)
            self._evict()

    def set_version(self, version: int) -> None:
        """The policy changed: responses older than `max_age` versions are dropped."""
        self.version = version
        for p in self._prompts.values():
            old = [
                i for i, s in p.sequences.items() if i and not s.live and version - s.version > self.max_age
            ]
            self._drop(p, old)

    # -- drafting ---------------------------------------------------------------------

    def propose(self, key: bytes, seq: int, context: Sequence[int], k: int, min_depth: int = 0) -> list[int]:
        """Up to `k` draft tokens after `context` (the request's prompt and response so
        far) for its response sequence `seq`; [] when history has no match, or none whose
        preceding tokens agree with the context's over at least `min_depth` tokens (a
        confident match: the hybrid's test)."""
        p = self._prompts.get(key)
        if p is None or len(context) < self.min_match or k <= 0:
            return []
        own_end = len(p.sequences[seq].tokens) if seq in p.sequences else -1
        context = [int(t) for t in context]
        draft: list[int] = []
        candidates = self._matches(p, seq, own_end, context, min_depth)
        while candidates and len(draft) < k:
            following = Counter(p.sequences[i].tokens[pos] for i, pos in candidates)
            token, count = following.most_common(1)[0]
            if count < self.min_share * len(candidates):
                break
            draft.append(token)
            candidates = [
                (i, pos + 1)
                for i, pos in candidates
                if p.sequences[i].tokens[pos] == token and pos + 1 < len(p.sequences[i].tokens)
            ]
            if not candidates:  # every match ended: look the draft's own tail up afresh
                candidates = self._matches(p, seq, own_end, context + draft, min_depth)
        return draft

    def _matches(
        self, p: _Prompt, seq: int, own_end: int, context: list[int], min_depth: int
    ) -> list[tuple[int, int]]:
        """The indexed positions whose preceding tokens match the context's end longest,
        over `min_depth` tokens at least (the request's own end excepted), the most recent
        MAX_CANDIDATES compared."""
        if len(context) < self.min_match:
            return []
        tail = tuple(context[-self.min_match :])
        found = [
            (i, pos)
            for i, pos in reversed(p.index.get(tail, ()))
            if i in p.sequences and not (i == seq and pos == own_end)
        ]
        best, out = self._longest(p, found[:MAX_CANDIDATES], context)
        return out if best >= min_depth else []

    def _longest(
        self, p: _Prompt, found: list[tuple[int, int]], context: Sequence[int]
    ) -> tuple[int, list[tuple[int, int]]]:
        """The candidates whose preceding tokens match the context longest, with a token
        to follow them, and over how many tokens they match."""
        best, out = 0, []
        for i, pos in found:
            tokens = p.sequences[i].tokens
            if pos >= len(tokens):
                continue
            n = self.min_match
            while (
                n < self.max_depth and n < pos and n < len(context) and tokens[pos - n - 1] == context[-n - 1]
            ):
                n += 1
            if n > best:
                best, out = n, [(i, pos)]
            elif n == best:
                out.append((i, pos))
        return best, out

    # -- bookkeeping ------------------------------------------------------------------

    def _add(self, p: _Prompt, tokens: list[int], *, live: bool) -> int:
        seq = p.next_id
        p.next_id += 1
        p.sequences[seq] = _Sequence([], self.version, live)
        self._append(p, seq, tokens)
        return seq

    def _append(self, p: _Prompt, seq: int, tokens: Sequence[int]) -> None:
        """Each position indexed by the `min_match` tokens before it."""
        s = p.sequences[seq]
        for t in tokens:
            if len(s.tokens) >= self.min_match:
                p.index.setdefault(tuple(s.tokens[-self.min_match :]), []).append((seq, len(s.tokens)))
            s.tokens.append(int(t))
        self.tokens += len(tokens)

    def _evict(self) -> None:
        """Over `max_prompts` or `max_tokens`: the least recently started prompts go
        (never the most recent one)."""
        while len(self._prompts) > 1 and (
            len(self._prompts) > self.max_prompts or self.tokens > self.max_tokens
        ):
            _, p = self._prompts.popitem(last=False)
            self.tokens -= sum(len(s.tokens) for s in p.sequences.values())

    def _trim(self, p: _Prompt) -> None:
        """At most `max_sequences_per_prompt` finished responses: the oldest go."""
        done = [i for i, s in p.sequences.items() if i and not s.live]
        self._drop(p, done[: max(0, len(done) - self.max_sequences_per_prompt)])

    def _drop(self, p: _Prompt, sequences: list[int]) -> None:
        if not sequences:
            return
        for i in sequences:
            gone = len(p.sequences.pop(i).tokens)
            self.tokens -= gone
            p.stale += max(0, gone - self.min_match)
        if p.stale > sum(len(s.tokens) for s in p.sequences.values()):  # compact
            for tail in list(p.index):
                kept = [(i, pos) for i, pos in p.index[tail] if i in p.sequences]
                if kept:
                    p.index[tail] = kept
                else:
                    del p.index[tail]
            p.stale = 0
