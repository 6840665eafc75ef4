"""omnistage: a serving system for Qwen3-Omni-style models.

Public API (imported on first use, so ``import omnistage`` stays light)::

    from omnistage import Omni
    omni = Omni(model="tiny")
    for out in omni.generate("Hi!", modalities=["text", "audio"], stream=True, max_tokens=64, seed=0):
        ...

``AsyncOmni`` is the asyncio engine the OpenAI server runs; ``SamplingParams``
is how a request samples, from the caller's knobs to a stage engine's sampler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "Omni": "omnistage.pipeline.omni",
    "AsyncOmni": "omnistage.pipeline.async_omni",
    "PipelineOptions": "omnistage.pipeline.runtime",
    "SamplingParams": "omnistage.sampling_params",
    "OmniOutput": "omnistage.core",
    "OmniRequest": "omnistage.core",
}

if TYPE_CHECKING:
    from omnistage.core import OmniOutput, OmniRequest
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.omni import Omni
    from omnistage.pipeline.runtime import PipelineOptions
    from omnistage.sampling_params import SamplingParams


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omnistage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["AsyncOmni", "Omni", "OmniOutput", "OmniRequest", "PipelineOptions", "SamplingParams", "__version__"]
