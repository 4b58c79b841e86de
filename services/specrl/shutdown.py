"""Bounded shutdown of a service process. Once a stop is asked (SIGTERM, SIGINT), the
graceful path (drain gRPC, close weight groups, stop engines) gets a deadline, then the
process exits anyway: a collective stuck on a dead peer (gloo waits up to 30 minutes)
must not keep a trainer or engine alive after the run that started it is gone."""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("specrl.shutdown")

GRACE_S = 20.0


def exit_after(seconds: float = GRACE_S, code: int = 1) -> None:
    """Exit the process in `seconds` unless it has exited by then."""

    def deadline() -> None:
        time.sleep(seconds)
        log.error("shutdown took over %.0fs: exiting now", seconds)
        logging.shutdown()
        os._exit(code)

    threading.Thread(target=deadline, name="shutdown-deadline", daemon=True).start()
