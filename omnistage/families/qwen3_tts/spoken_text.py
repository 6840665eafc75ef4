"""Qwen3-TTS speaking text as it is written: the dual-track talker reads one text row per frame, so it can start on
the first words and take the rest as they come.

The utterance is laid out as the reference's streaming mode lays out the whole text (``non_streaming_mode=False``):
the first body id in the prompt beside ``codec_bos``, every later id (then ``tts_eos``) a trailing row one step
each. Ids are released only once later text cannot change them (:class:`StableTokens`), so the talker reads the
whole text's ids row for row; where the text has not arrived yet it waits (the reference, knowing the whole text,
never meets such a row). So a greedy or seeded delta-fed utterance is the one-shot streaming-mode utterance of the
same text. A voice cloned in context starts once the text fills the reference's codec rows (its layout puts that
many text rows in the prompt). Text that ends before the talker could start is spoken as one whole prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from omnistage.core import Prompt
from omnistage.families.qwen3_tts.payloads import TextAppend
from omnistage.families.speech import SpokenText, TextStep
from omnistage.models.qwen3_tts.prompt import PromptSpec, icl_codec_rows
from omnistage.models.qwen3_tts.request import TextTokenizer

ROLE_TOKENS, TEXT_TAIL, REF_TAIL = 3, 5, 2  # the wrappers' ids around a text (models/qwen3_tts/prompt.py)


class Qwen3TTSSpokenText(SpokenText):
    def __init__(self, spec: PromptSpec, tokenizer: TextTokenizer, bound: Callable[[Prompt, int], int],
                 room: int) -> None:
        """``spec``: the utterance's settings, validated, in streaming mode (its text ids a placeholder's);
        ``bound``: the front end's frame bound of a prompt in ``room`` positions."""
        self.spec, self.bound, self.room = spec, bound, room
        self.stream = tokenizer.text_stream()
        self.role, self.tail = spec.text_ids[:ROLE_TOKENS], spec.text_ids[-TEXT_TAIL:]
        self.body: list[int] = []
        self.started = False
        clone = spec.voice_clone
        ref = len(clone.ref_text_ids[ROLE_TOKENS:-REF_TAIL]) if clone is not None and clone.icl else 0
        # Body ids the prompt needs: one beside codec_bos, or enough to fill a clone's codec rows.
        self.needed = max(1, icl_codec_rows(clone) - ref) if clone is not None and clone.icl else 1

    def add(self, text: str, done: bool = False) -> TextStep:
        ids = self.stream.add(text) + (self.stream.finish() if done else [])
        if self.started:
            return TextStep(more=self._more(ids, done)) if ids or done else TextStep()
        self.body += ids
        if done:
            if not self.body:
                raise ValueError("the text to speak is empty")
            self.started = True
            return TextStep(opening=replace(self.spec, text_ids=self.role + self.body + self.tail))
        if len(self.body) < self.needed:
            return TextStep()
        self.started = True
        return TextStep(opening=replace(self.spec, text_ids=self.role + self.body, open_text=True))

    def _more(self, ids: list[int], done: bool) -> TextAppend:
        self.body += ids
        if not done:
            return TextAppend(ids)
        whole = replace(self.spec, text_ids=self.role + self.body + self.tail)
        return TextAppend(ids, done=True, tail_tokens=TEXT_TAIL, max_frames=self.bound(whole, self.room))

    def max_frames(self, prompt: Prompt) -> int:
        return self.bound(prompt, self.room)  # an open prompt's: its context's room
