"""Admission of Generate calls around weight updates.

Chosen semantics (docs/weightsync.md): requests in flight when an update begins finish on
the old weights; new requests wait at the gate until the update commits or aborts. So
every sample is produced by exactly one (policy, draft) version pair, the one stamped on
it at admission.
"""

from __future__ import annotations

import asyncio


class DrainTimeout(TimeoutError):
    pass


class AdmissionGate:
    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0

    async def enter(self, n: int = 1) -> None:
        """Wait until the gate is open, then count `n` requests in flight."""
        while not self._open.is_set():  # re-check: the gate may close again before we run
            await self._open.wait()
        self.in_flight += n
        self._idle.clear()

    def leave(self, n: int = 1) -> None:
        self.in_flight -= n
        if self.in_flight == 0:
            self._idle.set()

    async def close_and_drain(self, timeout_s: float) -> None:
        """Stop admitting, then wait for the requests in flight; reopens on timeout."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            self._open.set()
            raise DrainTimeout(
                f"{self.in_flight} requests still in flight after {timeout_s:g}s "
                "(weight_sync.drain_timeout_s)"
            ) from None

    def open(self) -> None:
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()
