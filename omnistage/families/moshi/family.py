"""Moshi as a registered family: a duplex model, served by the duplex engine rather than a stage pipeline.

Moshi listens and speaks at once, one 80 ms frame in and one out per session, so it has no request → reply
pipeline: :mod:`omnistage.engine.duplex` clocks its sessions and batches them into one step a tick, through
:class:`omnistage.families.moshi.duplex_model.MoshiDuplexModel`. The family still declares what the server reads
without weights (its audio, its text tokenizer) and its make-tiny and verify hooks.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.families.base import EdgeContext, Family, FrontEnd, Hooks
from omnistage.families.moshi.config import MODEL_TYPE, MoshiConfig, is_moshi
from omnistage.ipc.messages import PayloadTypes

_HOOKS = "omnistage.families.moshi"
TINY_NAMES = ("moshi-tiny", "moshi-medium", "personaplex-tiny")


class DuplexOnly(ValueError):
    """Raised where a stage pipeline is asked of a duplex family."""


class MoshiFamily(Family):
    name = "moshi"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({})
    edges = MappingProxyType({})
    payloads = PayloadTypes(())
    hooks = Hooks(make_tiny=f"{_HOOKS}.make_tiny:make_tiny_command", verify=f"{_HOOKS}.verify:run_verify_command",
                  cached=f"{_HOOKS}.make_tiny:cached_checkpoint", tiny_names=TINY_NAMES,
                  duplex=f"{_HOOKS}.duplex_model:load_duplex")

    def recognises(self, raw: object) -> bool:
        return isinstance(raw, dict) and is_moshi(raw)

    def load_config(self, folder: Path) -> MoshiConfig:
        return MoshiConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        raise DuplexOnly("Moshi is a duplex model: it is served by duplex sessions, not a stage pipeline")

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        cfg = _config(config)
        return FrontEnd(tokenizer_of(folder), None, (), cfg.context, audio_spec(cfg))

    def entry_input(self, context: EdgeContext) -> object:
        raise DuplexOnly("Moshi takes duplex sessions, not requests")


def audio_spec(cfg: MoshiConfig) -> AudioSpec:
    """Mimi at 24 kHz, 1920 samples a frame; the agent's codebooks, the acoustic ones one frame late."""
    return AudioSpec(cfg.codec.sampling_rate, cfg.codec.frame_size,
                     Codebooks(cfg.num_codebooks, cfg.audio_vocab_size, cfg.delays))


def tokenizer_of(folder: Path) -> object | None:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def _config(config: object) -> MoshiConfig:
    if not isinstance(config, MoshiConfig):
        raise TypeError(f"expected a MoshiConfig, got {type(config).__name__}")
    return config


FAMILY = MoshiFamily()
