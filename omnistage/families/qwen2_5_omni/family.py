"""Qwen2.5-Omni as a registered family: its stage models, payloads, preset and tool hooks.

Served today: the thinker on omnistage's engine (text out). The talker (one codebook per step) and token2wav
(DiT flow matching + BigVGAN) stages are not yet ported; the preset is the thinker alone.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from omnistage.core import Modality
from omnistage.families.base import EdgeContext, Family, FrontEnd, Hooks, StageModel
from omnistage.families.qwen2_5_omni.payloads import PAYLOADS, ThinkerPrompt
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.sampling import request_params
from omnistage.models.qwen2_5_omni.config import MODEL_TYPE, Qwen25OmniConfig

PRESET = Path(__file__).with_name("qwen2_5_omni_text.yaml")
_HERE = "omnistage.families.qwen2_5_omni"


class Qwen25OmniFamily(Family):
    name = "qwen2_5_omni"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "thinker": StageModel("ar", f"{_HERE}.workers:ThinkerWorker", output=Modality.TEXT, entry=True),
    })
    edges = MappingProxyType({})
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HERE}.make_tiny:make_tiny_command", verify=f"{_HERE}.verify:run_verify",
                  cached=f"{_HERE}.make_tiny:cached_checkpoint", tiny_names=("omni25-tiny",))

    def load_config(self, folder: Path) -> Qwen25OmniConfig:
        return Qwen25OmniConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPromptProcessor

        cfg = _config(config)
        processor = Qwen25OmniPromptProcessor(folder, cfg.hf.thinker_config)
        return FrontEnd(processor.tokenizer, processor, (), cfg.max_positions)

    def entry_input(self, context: EdgeContext) -> ThinkerPrompt:
        request = context.request
        prompt = request.prompt
        if not isinstance(prompt, Qwen25OmniPrompt):
            raise TypeError(f"a Qwen2.5-Omni request carries a Qwen25OmniPrompt, not {type(prompt).__name__}")
        return ThinkerPrompt(list(prompt.token_ids), request_params(request.sampling), prompt.mm)


def _config(config: object) -> Qwen25OmniConfig:
    if not isinstance(config, Qwen25OmniConfig):
        raise TypeError(f"expected a Qwen25OmniConfig, got {type(config).__name__}")
    return config


FAMILY = Qwen25OmniFamily()
