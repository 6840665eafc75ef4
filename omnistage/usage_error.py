"""``UsageError``: a mistake in what the user asked for on the command line.

Raised by the server's flag checks and by the tools' commands alike (``plan``, ``verify``, ``make-tiny``); the
CLI reports it as one ``omnistage: error:`` line and exit code 2 (``entrypoints/cli_errors.py``). It lives below
both so that a tool never imports the server's entry points to say what is wrong.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A mistake in what the user asked for: reported as one ``omnistage: error:`` line, exit code 2."""
