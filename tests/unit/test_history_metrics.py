"""The hybrid's rows per draft source on /metrics (rollout/service.py HistoryRows): the
engine's growing counts become counter increments, whatever order reads land in. The
exported values against a real hybrid server: tests/integration/test_lossless.py."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from specrl.metrics import RolloutMetrics
from specrl.rollout.service import HistoryRows


def test_rows_are_counted_once_whatever_order_the_reads_land_in():
    registry = CollectorRegistry()
    rows = HistoryRows(RolloutMetrics(registry))

    def exported(source: str) -> float | None:
        return registry.get_sample_value("specrl_rollout_history_rows_total", {"source": source})

    rows.publish({"history": 10, "model": 4, "tokens": 900})
    rows.publish({"history": 25, "model": 4})  # a later read
    rows.publish({"history": 18, "model": 3})  # one that overtook it: older counts, nothing added
    assert exported("history") == 25 and exported("model") == 4
    rows.publish({"history": 30, "model": 9, "extended": 5})
    assert exported("history") == 30 and exported("model") == 9
    rows.publish({"history": 30, "model": 9, "extended": 4})  # an older read
    assert registry.get_sample_value("specrl_rollout_history_extended_rows_total") == 5
