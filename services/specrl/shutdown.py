"""Shutdown of a service process. Once a stop is asked (SIGTERM, SIGINT), the graceful
path (drain gRPC, close weight groups, stop engines) gets a deadline, then the process
exits anyway: a collective stuck on a dead peer (gloo waits up to 30 minutes) must not
keep a trainer or engine alive after the run that started it is gone. A process that
ran torch.distributed collectives ends through `exit_now` (why there)."""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger("specrl.shutdown")

GRACE_S = 20.0


def exit_after(seconds: float = GRACE_S) -> None:
    """Exit the process (code 1) in `seconds` unless it has exited by then, printing every
    thread's stack first (what held the shutdown up). faulthandler's watchdog is a C
    thread that needs no GIL: a Python thread would never run while the main thread sits
    in a C call that holds the GIL (a trainer outlived a killed run that way, once in a
    full suite run on 2 cores)."""
    log.info("stopping: the process exits within %.0fs", seconds)
    faulthandler.dump_traceback_later(seconds, exit=True)


def exit_now(code: int = 0) -> NoReturn:
    """End the process: destroy any torch.distributed process groups, flush, and leave
    without interpreter finalization.

    Why not a normal exit: a gloo worker thread releases a finished collective's tensors
    a moment after the caller's wait returns; if the interpreter is being torn down by
    then, taking the GIL to free a tensor's Python object ends the thread inside a
    noexcept destructor and the process aborts (SIGABRT, "terminate called without an
    active exception"; about 1 run in 10 of a TP=2 trainer step on 2 CPU cores, in
    AsyncAllgatherCoalescedWork's destructor). destroy_process_group does not join those
    threads while anything still holds the groups (after it and a gc, the world group's
    refcount was still 14 in a TP=2 trainer process). Nothing Python would run at
    exit is needed by then: callers finish their output first."""
    dist = sys.modules.get("torch.distributed")  # a process that never loaded torch has no group
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
