"""The shutdown deadline (specrl.shutdown.exit_after) ends the process even while its
main thread sits in a C call that never releases the GIL, where a Python timer thread
would never run again."""

from __future__ import annotations

import signal
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


SERVES_UNTIL_STOPPED = """
import grpc
from concurrent import futures
from specrl import serving
server = grpc.server(futures.ThreadPoolExecutor(1))
server.start()
asked = serving.stop_signals()
print("ready", flush=True)
serving.wait_for_stop(server, asked)
print("stopped", flush=True)
"""


def test_a_burst_of_stop_signals_stops_a_service_promptly():
    """SIGTERM after SIGTERM (a run killed: the kernel's parent-death signal, then the
    launcher's own) must not hang the service: a handler that took a lock deadlocked when
    the second signal interrupted the first handler holding it."""
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVES_UNTIL_STOPPED], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for _ in range(200):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("a burst of SIGTERMs hung the service") from None
        assert "stopped" in proc.stdout.read()
