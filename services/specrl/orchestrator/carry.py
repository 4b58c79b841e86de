"""History carried between rollout replicas: the orchestrator keeps each prompt's last
group of responses and sends them (Prompt.history) with the prompt's next group to a
replica that drafts from history (SpeculationState.history) and has not seen the prompt
since it started (RolloutStatus.instance). So a replica that restarted, joined, or took
over a prompt from another (rendezvous routing moves a prompt when replicas come and go,
or when its own replica is full) drafts from the prompt's history from its first sight,
not only from its second epoch. The rollout servers keep the history itself; this is only
the last group per prompt, under a token budget (least recently used prompts out; 4 bytes
a token), for the next replica that needs it."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence


class HistoryCarry:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._responses: OrderedDict[bytes, list[array]] = OrderedDict()  # least recently used first
        self._seen: dict[str, tuple[str, set[bytes]]] = {}  # replica -> instance, prompts it has

    def observe(self, replica: str, instance: str) -> None:
        """A replica's instance, read from its status: a new one has none of its
        predecessor's history."""
        if self._seen.get(replica, ("", set()))[0] != instance:
            self._seen[replica] = (instance, set())

    def instance(self, replica: str) -> str | None:
        """The replica's instance as last read."""
        seen = self._seen.get(replica)
        return seen[0] if seen else None

    def forget(self, replica: str) -> None:
        self._seen.pop(replica, None)

    def to_send(self, replica: str, key: bytes) -> list[list[int]]:
        """The responses to carry to `replica` with prompt `key`'s next group: the last
        group's, unless the replica has seen the prompt since it started."""
        seen = self._seen.get(replica)
        if seen is None or key in seen[1] or key not in self._responses:
            return []
        return [r.tolist() for r in self._responses[key]]

    def generated(self, replica: str, key: bytes, responses: Sequence[Sequence[int]]) -> None:
        """`replica` generated (and so keeps) a group of prompt `key`: the carry keeps
        these responses in place of the last group's."""
        if replica in self._seen:
            self._seen[replica][1].add(key)
        old = self._responses.pop(key, [])
        self.tokens -= sum(len(r) for r in old)
        kept = [array("i", r) for r in responses]
        size = sum(len(r) for r in kept)
        if size > self.max_tokens:
            return
        self._responses[key] = kept
        self.tokens += size
        while self.tokens > self.max_tokens:
            _, gone = self._responses.popitem(last=False)
            self.tokens -= sum(len(r) for r in gone)
