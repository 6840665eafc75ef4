"""The talker prompt of one utterance, built row for row as ``Qwen3TTSForConditionalGeneration.generate`` builds it.

Two tracks are summed per row: a text track (``talker.embed_text`` of text ids, or ``tts_pad``/``tts_bos``/
``tts_eos``) and a codec track (``talker.embed_tokens`` of codec ids, a speaker's x-vector, or reference frames):

    [instructions]            "<|im_start|>user\\n{instructions}<|im_end|>\\n", text only (when given)
    role                      "<|im_start|>assistant\\n", text only
    codec prefix              tts_pad x (n - 2), tts_bos   +   nothink think_bos think_eos | think think_bos
                                                              <language> think_eos, [speaker], codec_pad
    then one of
      streaming text          first text token + codec_bos; the rest of the text, then tts_eos, are trailing
                              rows added to the talker's inputs one per step
      non-streaming text      (all text, tts_eos) + codec_pad each; tts_pad + codec_bos; no trailing text
      voice clone (ICL)       reference transcript + text + tts_eos against codec_bos + the reference's frames
                              (side by side when streaming, the text first otherwise)

After the trailing rows run out, every step adds ``tts_pad``. Text still being written (``PromptSpec.open_text``:
the ids so far, no closing tail) is laid out as streaming text whose end is not known: its later ids and
``tts_eos`` join the trailing rows as they arrive, and the talker waits at a row that has not (the whole text's
streaming layout, row for row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker

# "<|im_start|>assistant\n" leads the text ids; "<|im_end|>\n<|im_start|>assistant\n" ends them.
ROLE_TOKENS, TEXT_TAIL = 3, 5
# "<|im_start|>assistant\n{transcript}<|im_end|>\n": the transcript sits between 3 and 2 tokens.
REF_TAIL = 2


@dataclass(frozen=True)
class VoiceClone:
    """A Base model's voice from a reference recording: its x-vector, and (ICL mode) its codes and transcript."""

    speaker_embedding: torch.Tensor  # [H]
    ref_codes: torch.Tensor | None = None  # [T, G]; None: x-vector only
    ref_text_ids: list[int] | None = None  # "<|im_start|>assistant\n{transcript}<|im_end|>\n"

    def __post_init__(self) -> None:
        if (self.ref_codes is None) != (self.ref_text_ids is None):
            raise ValueError("a voice clone in ICL mode needs both the reference codes and its transcript")
        if not bool(torch.isfinite(self.speaker_embedding).all()):  # every request in this voice would fail
            raise ValueError("the reference recording gives no usable voice (its speaker embedding is not finite)")

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None


@dataclass(frozen=True)
class PromptSpec:
    """Everything a talker prompt depends on, as ids (tokenised by :mod:`omnistage.models.qwen3_tts.request`)."""

    text_ids: list[int]  # "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    instruct_ids: list[int] | None = None
    speaker: str | None = None  # CustomVoice
    language: str = "auto"
    voice_clone: VoiceClone | None = None
    non_streaming: bool = True  # the whole text in the prompt (True) or fed one token per step
    open_text: bool = False  # text_ids is the text so far without its closing tail; the rest comes later

    @property
    def num_tokens(self) -> int:
        """Text tokens the caller gave (the request's prompt tokens in its usage)."""
        return len(self.text_ids) + len(self.instruct_ids or ())


@dataclass(frozen=True)
class TalkerPrompt:
    embeds: torch.Tensor  # [L, H]
    trailing_text: torch.Tensor  # [K, H], added to the inputs of steps 0..K-1
    tts_pad: torch.Tensor  # [H], added to every later step
    text_finished: bool = True  # False: more trailing rows (and tts_eos) come as the text is written


class _Tracks:
    """The two embedding tables a prompt row is summed from, taking id lists."""

    def __init__(self, talker: Qwen3TTSTalker) -> None:
        self.talker, self.device = talker, talker.codec_head.weight.device

    def text(self, ids: list[int]) -> torch.Tensor:
        return self.talker.embed_text(torch.tensor(ids, dtype=torch.long, device=self.device))

    def codec(self, ids: list[int]) -> torch.Tensor:
        return self.talker.embed_tokens(torch.tensor(ids, dtype=torch.long, device=self.device))


@torch.no_grad()
def build_talker_prompt(talker: Qwen3TTSTalker, config: Qwen3TTSConfig, spec: PromptSpec) -> TalkerPrompt:
    ids = spec.text_ids
    if len(ids) < ROLE_TOKENS + (0 if spec.open_text else TEXT_TAIL) + 1:
        raise ValueError("the text to speak is empty")
    if spec.open_text and spec.non_streaming:
        raise ValueError("text still being written is spoken in streaming mode")
    tracks = _Tracks(talker)
    text, codec = tracks.text, tracks.codec
    t = config.token_ids
    tts_bos, tts_eos, tts_pad = text([t.tts_bos, t.tts_eos, t.tts_pad]).chunk(3)
    track = _codec_prefix(config, spec, tracks)  # [n, H]
    rows = torch.cat([tts_pad.expand(track.shape[0] - 2, -1), tts_bos]) + track[:-1]
    parts = [text(spec.instruct_ids)] if spec.instruct_ids else []
    parts += [text(ids[:ROLE_TOKENS]), rows]
    body = ids[ROLE_TOKENS:] if spec.open_text else ids[ROLE_TOKENS:-TEXT_TAIL]
    end = tts_eos[:0] if spec.open_text else tts_eos  # an open text's eos comes with its last ids
    c = config.talker.codec
    if spec.voice_clone is not None and spec.voice_clone.icl:
        icl, trailing = _icl_rows(spec.voice_clone, spec.non_streaming, tracks,
                                  text(spec.voice_clone.ref_text_ids[ROLE_TOKENS:-REF_TAIL] + body), end, tts_pad,
                                  spec.open_text)
        parts.append(icl)
    elif spec.non_streaming:
        parts += [torch.cat([text(body), tts_eos]) + codec([c.pad] * (len(body) + 1)), tts_pad + codec([c.bos])]
        trailing = tts_pad
    else:
        parts.append(text(body[:1]) + track[-1:])
        trailing = torch.cat([text(body[1:]), end])
    return TalkerPrompt(torch.cat(parts), trailing, tts_pad[0], text_finished=not spec.open_text)


@torch.no_grad()
def text_rows(talker: Qwen3TTSTalker, ids: list[int]) -> torch.Tensor:
    """``[K, H]``: the text track of ``ids`` (an open text's later ids, as the trailing rows they become)."""
    return _Tracks(talker).text(ids)


def _codec_prefix(config: Qwen3TTSConfig, spec: PromptSpec, tracks: _Tracks) -> torch.Tensor:
    """``[n, H]``: the think tags (with the language), the voice row, ``codec_pad``, ``codec_bos``."""
    c, language = config.talker.codec, language_id(config, spec)
    tags = [c.nothink, c.think_bos, c.think_eos] if language is None else [c.think, c.think_bos, language, c.think_eos]
    voice = _voice_row(config, spec, tracks)
    rows = [tracks.codec(tags)] + ([voice[None]] if voice is not None else []) + [tracks.codec([c.pad, c.bos])]
    return torch.cat(rows)


def _voice_row(config: Qwen3TTSConfig, spec: PromptSpec, tracks: _Tracks) -> torch.Tensor | None:
    if spec.voice_clone is not None:
        weight = tracks.talker.codec_head.weight
        return spec.voice_clone.speaker_embedding.to(weight.device, weight.dtype)
    if not spec.speaker:
        return None
    return tracks.codec([speaker_id(config, spec.speaker)])[0]


def speaker_id(config: Qwen3TTSConfig, speaker: str) -> int:
    speakers = config.talker.speakers
    if speaker.lower() not in speakers:
        raise ValueError(f"unknown speaker {speaker!r}; this model has {sorted(speakers) or 'none'}")
    return speakers[speaker.lower()]


def language_id(config: Qwen3TTSConfig, spec: PromptSpec) -> int | None:
    """None for "auto"; a dialect speaker speaking Chinese (or auto) switches to its dialect, as the reference."""
    languages, lang = config.talker.languages, spec.language.lower()
    if lang != "auto" and lang not in languages:
        raise ValueError(f"unknown language {spec.language!r}; this model has {['auto', *sorted(languages)]}")
    chosen = None if lang == "auto" else languages[lang]
    dialect = config.talker.speaker_dialects.get(spec.speaker.lower(), False) if spec.speaker else False
    if lang in ("chinese", "auto") and spec.voice_clone is None and dialect is not False:
        chosen = languages[str(dialect).lower()]
    return chosen


def icl_codec_rows(clone: VoiceClone) -> int:
    """Prompt rows of in-context cloning's codec track (``codec_bos`` and the reference's frames): streamed text
    fills as many text rows before the talker can start."""
    return 1 + (clone.ref_codes.shape[0] if clone.ref_codes is not None else 0)


def _icl_rows(clone: VoiceClone, non_streaming: bool, tracks: _Tracks, text_rows: torch.Tensor,
              tts_eos: torch.Tensor, tts_pad: torch.Tensor, open_text: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt rows, trailing rows) of in-context voice cloning: the transcript and text against the reference's
    frames, each track led or padded as the reference lays them out (an open text fills every codec row first)."""
    if clone.ref_codes is None:
        raise ValueError("in-context voice cloning needs the reference codes")
    talker, codec = tracks.talker, tracks.codec
    c = talker.config.codec
    text_rows = torch.cat([text_rows, tts_eos])
    frames = talker.frame_embedding(clone.ref_codes.to(tracks.device))
    codec_rows = torch.cat([codec([c.bos]), frames])
    if non_streaming:
        text_part = text_rows + codec([c.pad] * text_rows.shape[0])
        return torch.cat([text_part, codec_rows + tts_pad]), tts_pad
    n = codec_rows.shape[0]
    if open_text and text_rows.shape[0] < n:
        raise ValueError(f"in-context cloning starts once the text fills {n} rows; it has {text_rows.shape[0]}")
    if text_rows.shape[0] > n or (open_text and text_rows.shape[0] == n):
        return text_rows[:n] + codec_rows, text_rows[n:]
    padded = torch.cat([text_rows, tts_pad.expand(n - text_rows.shape[0], -1)])
    return padded + codec_rows, tts_pad
