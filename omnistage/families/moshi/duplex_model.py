"""Moshi as the duplex engine's model (:class:`omnistage.engine.duplex.base.DuplexModel`), and its prompts.

Silence and the "sine" frame are Mimi codes: the published Mimi's are PersonaPlex's constants; a checkpoint
omnistage made (random Mimi) carries its own in ``mimi_frames.json``, computed by its Mimi when it was written.

PersonaPlex's prompts, in its own order (``LMGen.step_system_prompts``): the voice prompt's frames (the agent
speaking them, the text padded, the user's stream a sine), silence frames, the text prompt one token a frame
(the agent silent), silence frames again; every token given, so the whole prompt is one prefill.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.engine.duplex.base import DuplexServed, DuplexStep
from omnistage.families.moshi.checkpoint import load_moshi
from omnistage.families.moshi.config import FRAME_RATE, MoshiConfig
from omnistage.families.moshi.model import DuplexSampling
from omnistage.families.moshi.streams import ForcedFrames, MoshiStreams

FRAMES_FILE = "mimi_frames.json"
# The published Mimi's codes of a silent frame and of a 440 Hz sine frame (PersonaPlex's lm.py constants).
PUBLISHED_SILENCE = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
PUBLISHED_SINE = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
PROMPT_SILENCE_FRAMES = 6  # PersonaPlex's half second of silence after each prompt
END_OF_PADDING_ID = 0  # Kyutai's text id closing a run of padding before a word: no text either
PERSONA_DEPTH_STEPS = 16  # PersonaPlex's depth decoder (it also predicts the user's codes); Moshi's has 8


@dataclass(frozen=True)
class MimiFrames:
    silence: tuple[int, ...]
    sine: tuple[int, ...]

    @classmethod
    def for_checkpoint(cls, folder: Path, cfg: MoshiConfig) -> MimiFrames:
        path = Path(folder) / FRAMES_FILE
        if path.is_file():
            raw = json.loads(path.read_text())
            return cls(tuple(raw["silence"]), tuple(raw["sine"]))
        if cfg.audio_vocab_size == 2048 and cfg.num_codebooks == len(PUBLISHED_SILENCE):
            return cls(PUBLISHED_SILENCE, PUBLISHED_SINE)
        raise FileNotFoundError(f"{folder} has no {FRAMES_FILE} and is not the published Mimi's layout: "
                                "its silence codes are unknown")


@dataclass(frozen=True)
class PersonaPrompt:
    """A PersonaPlex session's prompt: a voice (Mimi codes [F, K] of its reference audio) and text token ids."""

    voice: torch.Tensor
    text: Sequence[int]


def persona_frames(prompt: PersonaPrompt, frames: MimiFrames, cfg: MoshiConfig) -> ForcedFrames:
    silence, sine = torch.tensor(frames.silence), torch.tensor(frames.sine)
    pad = cfg.text_pad_id
    parts: list[tuple[int, torch.Tensor]] = [(pad, v) for v in prompt.voice]
    parts += [(pad, silence)] * PROMPT_SILENCE_FRAMES
    parts += [(int(t), silence) for t in prompt.text]
    parts += [(pad, silence)] * PROMPT_SILENCE_FRAMES
    return ForcedFrames(torch.tensor([t for t, _ in parts]), torch.stack([a for _, a in parts]),
                        sine.expand(len(parts), -1).clone())


class MoshiDuplexModel:
    """The engine's view of :class:`MoshiStreams`; a prompt is a :class:`PersonaPrompt` or ready
    :class:`ForcedFrames`."""

    def __init__(self, streams: MoshiStreams, frames: MimiFrames) -> None:
        self.streams = streams
        self.frames = frames
        self._silence = torch.tensor(frames.silence)

    @property
    def frame_s(self) -> float:
        return 1.0 / FRAME_RATE

    @property
    def max_rows(self) -> int:
        return self.streams.max_rows

    @property
    def rows(self) -> int:
        return self.streams.rows

    def silence(self) -> torch.Tensor:
        return self._silence

    def open(self, prompt: object | None) -> int:
        if isinstance(prompt, PersonaPrompt):
            prompt = persona_frames(prompt, self.frames, self.streams.cfg)
        if prompt is not None and not isinstance(prompt, ForcedFrames):
            raise TypeError(f"a Moshi session's prompt is a PersonaPrompt or ForcedFrames, not {type(prompt).__name__}")
        return self.streams.open(prompt)

    def close(self, row: int) -> int | None:
        return self.streams.close(row)

    def step(self, user: torch.Tensor) -> DuplexStep:
        out = self.streams.step(user)
        return DuplexStep(out.text, out.frames, out.complete)


def load_duplex_model(folder: str | Path, max_sessions: int, sampling: DuplexSampling = DuplexSampling(),
                      dtype: torch.dtype = torch.float32) -> MoshiDuplexModel:
    """The family's ``duplex`` hook: a checkpoint folder as the duplex engine's model."""
    cfg = MoshiConfig.from_folder(folder)
    model = load_moshi(folder, cfg, dtype=dtype)
    return MoshiDuplexModel(MoshiStreams(model, max_sessions, sampling), MimiFrames.for_checkpoint(Path(folder), cfg))


class TextPrompt:
    """PersonaPlex's session prompt from a live session's instructions: its text prompt as its server wraps it
    (``<system> ... <system>``), with no voice prompt (its voices are embeddings this server does not hold)."""

    def __init__(self, tokenizer: object, codebooks: int) -> None:
        self.tokenizer, self.codebooks = tokenizer, codebooks

    def __call__(self, instructions: str | None, voice: str | None) -> PersonaPrompt | None:
        if not instructions or not instructions.strip():
            return None
        text = instructions.strip()
        if not (text.startswith("<system>") and text.endswith("<system>")):
            text = f"<system> {text} <system>"
        ids = self.tokenizer.encode(text).ids  # type: ignore[attr-defined] - a tokenizers.Tokenizer
        return PersonaPrompt(torch.zeros(0, self.codebooks, dtype=torch.long), ids)


def load_duplex(folder: str | Path, max_sessions: int, dtype: str = "float32") -> DuplexServed:
    """The family's ``duplex`` hook: Moshi (weights and KV in ``dtype``) and its Mimi in fp32 (user audio in, agent
    audio out), Kyutai's sampling; a PersonaPlex checkpoint (16 depth steps) with a tokenizer takes a live
    session's instructions as its text prompt, Moshi takes none."""
    from omnistage.families.moshi.family import tokenizer_of
    from omnistage.families.moshi.mimi_frames import load_frame_codec

    model = load_duplex_model(folder, max_sessions, dtype=getattr(torch, dtype))
    cfg = model.streams.cfg
    tokenizer = tokenizer_of(Path(folder))
    persona = cfg.depth.steps == PERSONA_DEPTH_STEPS and tokenizer is not None
    return DuplexServed(model, load_frame_codec(folder, cfg.num_codebooks),
                        prompt=TextPrompt(tokenizer, cfg.num_codebooks) if persona else None,
                        silent_text=frozenset({cfg.text_pad_id, END_OF_PADDING_ID}))
