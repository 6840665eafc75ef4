"""Qwen3-TTS's speech front end: a caller's text and voice validated against the checkpoint and tokenised.

CustomVoice checkpoints take one of their speakers as ``voice`` (and ``instructions`` where the model uses
them), VoiceDesign checkpoints a voice described in ``instructions``; Base checkpoints clone a voice from a
reference recording, which this front end does not take yet (a clear error says so).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.core import Prompt
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.prompt import PromptSpec
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, prompt_spec

# A bound on frames per text token for a talker that will not stop (12.5 frames a second: 0.64 s a token,
# several times what speech takes), plus a few seconds for short inputs.
FRAMES_PER_TOKEN = 8
EXTRA_FRAMES = 40
# Prompt rows beside the text: role, codec prefix (think/language/speaker), the closing specials.
PROMPT_OVERHEAD_ROWS = 16


class Qwen3TTSSpeech(SpeechFrontEnd):
    def __init__(self, folder: str | Path, config: Qwen3TTSConfig) -> None:
        self.config = config
        self.tokenizer = TextTokenizer(folder)
        kind = config.tts_model_type
        self.speakers = tuple(config.talker.speakers) if kind == "custom_voice" else ()
        self.needs_instructions = kind == "voice_design"

    def prompt(self, ask: SpeechAsk) -> PromptSpec:
        if self.config.is_base:
            raise ValueError("this Base checkpoint clones a voice from a reference recording, which the speech "
                             "endpoint does not take yet; serve a CustomVoice or VoiceDesign checkpoint")
        if self.needs_instructions and not (ask.instructions and ask.instructions.strip()):
            raise ValueError("this VoiceDesign checkpoint needs the voice described in instructions")
        speaker = ask.voice if self.speakers else None
        speech = SpeechInput(ask.text, speaker=speaker, instructions=ask.instructions or None, language=ask.language)
        return prompt_spec(self.config, self.tokenizer, speech)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        rows = prompt.num_tokens + PROMPT_OVERHEAD_ROWS
        if room - rows < 1:
            raise ValueError(f"the input is {prompt.num_tokens} tokens; this model's context is {room}")
        return min(room - rows, FRAMES_PER_TOKEN * prompt.num_tokens + EXTRA_FRAMES)
