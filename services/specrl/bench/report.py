"""Shared parts of the benchmarks' reports: the machine they ran on and speedups over
autoregressive decoding."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Hashable


def machine() -> dict:
    """Where a benchmark ran (recorded in its JSON: ratios compare only within one; the
    simulator's calibration checks the accelerator, None for the CPU)."""
    import torch

    accelerator = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "accelerator": accelerator}


def speedups_over_ar(rows: list[dict], group: Callable[[dict], Hashable]) -> None:
    """Set each row's speedup_vs_ar: tokens/s over the fastest AR row of its group (AR is
    measured first and last, so drift during the run cannot flatter speculation)."""
    best: dict[Hashable, float] = {}
    for r in rows:
        if r["method"] == "ar":
            best[group(r)] = max(best.get(group(r), 0.0), r["tokens_per_s"])
    for r in rows:
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / best[group(r)], 3)
