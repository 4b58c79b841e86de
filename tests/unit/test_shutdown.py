"""The shutdown deadline (specrl.shutdown.exit_after) ends the process even while its
main thread sits in a C call that never releases the GIL, where a Python timer thread
would never run again."""

from __future__ import annotations

import subprocess
import sys
import time

HOLDS_THE_GIL = """
from specrl import shutdown
shutdown.exit_after(1.0)
sum(range(10**12))  # minutes in C without releasing the GIL
"""


def test_the_deadline_ends_a_process_stuck_in_c_holding_the_gil():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", HOLDS_THE_GIL], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 1 and took < 20, (out.returncode, took, out.stderr[-2000:])
    assert "Timeout" in out.stderr and "<module>" in out.stderr  # the stacks it was stuck in
