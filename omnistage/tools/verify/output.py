"""Where a verify report goes."""

from __future__ import annotations

from pathlib import Path


def write_json(target: str | None, text: str) -> None:
    """``-`` is stdout (the table then went to stderr, so stdout parses as JSON)."""
    if target == "-":
        print(text)
    elif target:
        Path(target).write_text(text + "\n")
