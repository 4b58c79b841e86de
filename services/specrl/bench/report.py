"""Shared output of the benchmarks: the Markdown table docs/benchmarks.md shows."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(rows: list[dict], columns: Sequence[str]) -> str:
    """`rows` as a Markdown table of `columns` (missing values shown empty)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in columns) + " |")
    return "\n".join(lines)
