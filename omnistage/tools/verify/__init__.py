"""``omnistage verify``: omnistage against transformers' Qwen3-Omni on the same checkpoint and prompts.

The command's parser is ``omnistage.tools.verify.cli.add_verify_parser``. The comparison (torch, both models) is
imported on first use, so the CLI can list the command without loading it.
"""

from __future__ import annotations

import importlib

__all__ = ["CaseReport", "VerifyReport", "format_table", "run_verify"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'omnistage.tools.verify' has no attribute {name!r}")
    return getattr(importlib.import_module("omnistage.tools.verify.compare"), name)
