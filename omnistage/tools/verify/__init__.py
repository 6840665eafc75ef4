"""``omnistage verify``: omnistage against transformers' Qwen3-Omni on the same checkpoint and prompts.

The command's parser is ``omnistage.tools.verify.cli.add_verify_parser``.
"""

from omnistage.tools.verify.compare import CaseReport, VerifyReport, format_table, run_verify

__all__ = ["CaseReport", "VerifyReport", "format_table", "run_verify"]
