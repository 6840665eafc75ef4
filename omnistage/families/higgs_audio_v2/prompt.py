"""A Higgs Audio v2 utterance as ids: Llama 3's chat turns, the reference's system line, and the audio BOS.

::

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nGenerate audio following instruction.
    [\\n\\n<|scene_desc_start|>\\n{scene}\\n<|scene_desc_end|>]<|eot_id|>
    [<|start_header_id|>user<|end_header_id|>\\n\\n{ref_text}<|eot_id|>
     <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>{voice}<|audio_eos|><|eot_id|>]
    <|start_header_id|>user<|end_header_id|>\\n\\n{text}<|eot_id|><|start_header_id|>assistant<|end_header_id|>
    \\n\\n<|audio_out_bos|>

as Boson's reference lays a (cloned) generation out. A cloned voice is its reference audio's codes with the
transcript: its frames under the staircase (``delay.delayed_voice``) fill ``n + 2`` ``<|AUDIO_OUT|>`` positions
and ``G - 1`` delay-token positions. The client's strings stay text (``processing/user_text.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.higgs_audio_v2.config import HiggsConfig
from omnistage.families.higgs_audio_v2.delay import delayed_voice

SYSTEM = "Generate audio following instruction."
FRAMES_PER_TOKEN = 3.0  # a frame budget of ~3 frames (120 ms) a text token, and 2 s more, bounds a talker that
EXTRA_FRAMES = 50       # does not stop (speech runs ~1 token per 4-6 frames at 25 Hz)


@dataclass(frozen=True)
class HiggsPrompt:
    """Everything one utterance depends on; travels to the generator stage as it is."""

    ids: list[int]
    voice: torch.Tensor | None = None  # [G, n] the cloned voice's codes, or None
    text_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def input_ids(self, cfg: HiggsConfig) -> torch.Tensor:
        return torch.tensor(self.ids, dtype=torch.long)

    def audio_frames(self, cfg: HiggsConfig) -> torch.Tensor | None:
        return None if self.voice is None else delayed_voice(self.voice, cfg)

    def max_frames(self) -> int:
        return int(self.text_tokens * FRAMES_PER_TOKEN) + EXTRA_FRAMES


class HiggsTokenizer:
    """The checkpoint's tokenizer, with the ids the layout needs taken from the config."""

    def __init__(self, folder: str | Path, cfg: HiggsConfig) -> None:
        from transformers import PreTrainedTokenizerFast

        from omnistage.processing.user_text import guard_for

        self.cfg = cfg
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"))
        self.guard = guard_for(self.tokenizer)
        name = self.tokenizer.convert_ids_to_tokens
        self.audio, self.delay = name(cfg.audio_token_id), name(cfg.audio_delay_token_id)
        self.audio_bos = name(cfg.audio_bos_token_id)

    def prompt(self, text: str, voice: torch.Tensor | None = None, ref_text: str = "",
               scene: str | None = None) -> HiggsPrompt:
        text = " ".join(text.split())
        if not text:
            raise ValueError("input must hold some text to speak")
        template = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + SYSTEM
        fields = {"text": text}
        if scene:
            template += "\n\n<|scene_desc_start|>\n{scene}\n<|scene_desc_end|>"
            fields["scene"] = scene
        template += "<|eot_id|>"
        if voice is not None:
            groups, n = voice.shape
            audio = self.audio * (n + 2) + self.delay * (groups - 1)
            template += ("<|start_header_id|>user<|end_header_id|>\n\n{ref_text}<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n" + self.audio_bos + audio +
                         "<|audio_eos|><|eot_id|>")
            fields["ref_text"] = " ".join(ref_text.split())
        template += ("<|start_header_id|>user<|end_header_id|>\n\n{text}<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n" + self.audio_bos)
        ids = self.guard.wrapped_ids(template, **fields)  # the template's own text holds no braces
        count = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return HiggsPrompt(ids, voice, count)
