"""The offline Python entry point (vLLM's ``LLM`` counterpart): ``Omni`` drives the whole pipeline from Python.

Kept as a thin alias so ``omnistage.entrypoints`` lists every way in; the
implementation lives with the pipeline (:mod:`omnistage.pipeline.omni`).
"""

from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.omni import Omni, merge_outputs

__all__ = ["AsyncOmni", "Omni", "merge_outputs"]
