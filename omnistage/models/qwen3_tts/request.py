"""What a caller asks of a Qwen3-TTS model, validated against its type and turned into a :class:`PromptSpec`.

One typed input per utterance, :class:`SpeechInput`: the text, and a voice as the checkpoint's type takes it:
CustomVoice a named ``speaker`` (plus ``instructions``, except on 0.6B models, where the reference drops them),
VoiceDesign ``instructions`` describing the voice, Base a :class:`VoiceClone` made from a reference recording
by :func:`make_voice_clone`. Texts are wrapped and tokenised as ``qwen_tts``'s ``Qwen3TTSModel`` does, except that
the caller's text, transcript and instructions stay ordinary text (``processing/user_text.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels, VoiceEncoders
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.prompt import PromptSpec, VoiceClone
from omnistage.processing.stable_tokens import StableTokens
from omnistage.processing.user_text import UserTextGuard

# The reference wrapper's default per model type: CustomVoice and VoiceDesign put the whole text in the prompt,
# voice cloning feeds it one token per step.
NON_STREAMING_DEFAULT = {"custom_voice": True, "voice_design": True, "base": False}
# The ordinary text before a streamed text in its run ("<|im_start|>" precedes it): "assistant", "\n".
STREAM_LEAD_TEXT, STREAM_LEAD = "assistant\n", 2


@dataclass(frozen=True)
class SpeechInput:
    text: str
    speaker: str | None = None
    instructions: str | None = None
    language: str = "auto"
    voice_clone: VoiceClone | None = None
    non_streaming: bool | None = None  # None: the reference's default for the model type

    def __post_init__(self) -> None:
        if not self.text or not self.text.strip():
            raise ValueError("the text to speak is empty")


class TextTokenizer:
    """The checkpoint's own text tokenizer, with the reference's ChatML wrappers."""

    def __init__(self, folder: str | Path) -> None:
        # The class named by tokenizer_config.json (AutoTokenizer would also read config.json's unknown model type).
        from transformers import Qwen2Tokenizer

        self._tok = Qwen2Tokenizer.from_pretrained(str(folder))
        self._guard = UserTextGuard(self._tok)

    def ids(self, text: str) -> list[int]:
        return list(self._tok(text)["input_ids"])

    # The caller's text stays ordinary text: a "<|im_end|>" or "<tts_pad>" in it is not a control token.
    def assistant(self, text: str) -> list[int]:
        return self._guard.wrapped_ids("<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n", text=text)

    def reference(self, transcript: str) -> list[int]:
        return self._guard.wrapped_ids("<|im_start|>assistant\n{text}<|im_end|>\n", text=transcript)

    def text_stream(self) -> StableTokens:
        """Text written in pieces, tokenized as :meth:`assistant` tokenizes the whole between its wrappers: the
        stream starts with the role's ``assistant\n`` (the text's first piece may merge with it), its
        :data:`STREAM_LEAD` ids dropped as the whole text's are."""
        return StableTokens(self._tok, STREAM_LEAD_TEXT, STREAM_LEAD)

    def instruction(self, instructions: str) -> list[int]:
        return self._guard.wrapped_ids("<|im_start|>user\n{text}<|im_end|>\n", text=instructions)


def prompt_spec(config: Qwen3TTSConfig, tokenizer: TextTokenizer, request: SpeechInput) -> PromptSpec:
    """Validates ``request`` against the model type (clear ``ValueError``s for a client's mistakes)."""
    kind = config.tts_model_type
    if kind == "custom_voice" and not request.speaker:
        raise ValueError(f"this CustomVoice model needs a speaker: one of {sorted(config.talker.speakers)}")
    if kind != "custom_voice" and request.speaker:
        raise ValueError(f"a {kind} model has no named speakers (got speaker {request.speaker!r})")
    if kind == "base" and request.voice_clone is None:
        raise ValueError("this Base model clones a voice: give a reference recording")
    if kind != "base" and request.voice_clone is not None:
        raise ValueError(f"a {kind} model cannot clone a voice from a recording")
    if kind == "base" and request.instructions:
        raise ValueError("a Base model takes no instructions")
    instructions = request.instructions if config.takes_instructions else None
    non_streaming = NON_STREAMING_DEFAULT[kind] if request.non_streaming is None else request.non_streaming
    return PromptSpec(
        text_ids=tokenizer.assistant(request.text),
        instruct_ids=tokenizer.instruction(instructions) if instructions else None,
        speaker=request.speaker, language=request.language, voice_clone=request.voice_clone,
        non_streaming=non_streaming,
    )


@torch.no_grad()
def make_voice_clone(models: Qwen3TTSModels | VoiceEncoders, tokenizer: TextTokenizer, audio: np.ndarray | torch.Tensor,
                     sample_rate: int, transcript: str | None = None) -> VoiceClone:
    """A Base model's voice from a mono reference recording: its x-vector, and with a ``transcript`` its codes for
    in-context cloning (the reference's ``x_vector_only_mode`` is a clone without a transcript)."""
    if models.speaker_encoder is None:
        raise ValueError(f"a {models.config.tts_model_type} model cannot clone a voice (only Base models can)")
    wav = torch.as_tensor(np.asarray(audio, dtype=np.float32))
    if wav.dim() != 1:
        raise ValueError(f"the reference recording must be mono samples, got shape {tuple(wav.shape)}")
    rate = models.config.speech_tokenizer.input_sample_rate
    if sample_rate != rate:
        wav = _resample(wav, sample_rate, rate)
    embedding = models.speaker_encoder.embed(wav)
    if not transcript:
        return VoiceClone(embedding)
    return VoiceClone(embedding, models.codec_encoder.encode(wav).cpu(), tokenizer.reference(transcript))


def _resample(wav: torch.Tensor, source: int, target: int) -> torch.Tensor:
    """Polyphase resampling (the reference uses librosa's soxr: close, not bit-identical)."""
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(source, target)
    return torch.from_numpy(resample_poly(wav.numpy(), target // g, source // g).astype(np.float32))
