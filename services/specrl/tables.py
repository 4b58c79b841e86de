"""Tables of records, as Markdown (docs, run reports) and on the terminal: one format
for every report the product and the benchmarks write."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def markdown_table(rows: list[dict], columns: Sequence[str]) -> str:
    """`rows` as a Markdown table of `columns` (missing values shown empty)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in columns) + " |")
    return "\n".join(lines)


def print_table(rows: list[dict], columns: Sequence[str], title: str, console: Console) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r[c]) for c in columns))
    console.print(table)
