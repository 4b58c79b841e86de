"""The one error the simulator raises for bad input: a ValueError whose message says what
was wrong and what would be accepted, so the CLI can print it as it is."""

from __future__ import annotations


class SimError(ValueError):
    """Bad simulator input (unknown model or hardware, a layout that does not fit)."""


def unknown(kind: str, name: str, known: dict) -> SimError:
    """The error for a name not in a table, listing the table's names."""
    return SimError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}")
