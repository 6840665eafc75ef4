"""Names that point at code: ``"package.module:attr"`` strings, resolved in one place.

Configuration names code this way (a family's workers, hooks and edge loaders, the registry's families) so
nothing is imported until it is used: a replica imports only its own stage's worker, resolving a checkpoint
imports only its own family.
"""

from __future__ import annotations

import importlib


def resolve(target: str) -> object:
    """The object ``"package.module:attr"`` names (``attr`` may be dotted: ``module:Class.method``)."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{target!r} is not 'package.module:attr'")
    value: object = importlib.import_module(module)
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ImportError(f"{target!r}: {module} has no attribute {attr!r}") from None
    return value
