"""Chat completions on a conversational speech model (CSM): the reply is the last message's text, spoken as the
next turn of the conversation the earlier messages hold.

Laid out as transformers' CSM chat template lays a conversation out: each earlier message one text part and one
audio part (``input_audio``, or ``audio_url``), the last message its text alone. A message's ``name`` is its
speaker (``"0"``, ``"1"``); without one, assistant messages are the reply's speaker (``audio.voice``, or the last
message's ``name``) and user messages the other side. System and developer messages say nothing this model hears
and are skipped. The turns are bounded before admission as ``/v1/audio/speech``'s ``context`` is
(:mod:`omnistage.entrypoints.openai.speech.context`); the reply's transcript is the text it spoke.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.chat.inputs import TemplateOptions
from omnistage.entrypoints.openai.chat.protocol import (
    AudioURLPart,
    ChatCompletionRequest,
    ChatMessage,
    InputAudioPart,
    TextPart,
)
from omnistage.entrypoints.openai.chat.request import ChatPlan, audio_output
from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.common.tool_calls import tool_setup
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.speech.context import TurnAsked, check_turns
from omnistage.entrypoints.openai.speech.inputs import TextToSpeech
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest

_SKIPPED = ("system", "developer")


@dataclass(frozen=True)
class SpokenAsk:
    """What a chat body asks this model to say: the reply as a speech body, and the turns before it."""

    speech: SpeechRequest
    turns: tuple[TurnAsked, ...]


class SpokenChat:
    def __init__(self, engine: OmniEngine, served: ServedModel, inputs: TextToSpeech, limits: ServerLimits) -> None:
        self.engine, self.served, self.inputs, self.limits = engine, served, inputs, limits

    def prepare(self, body: ChatCompletionRequest) -> tuple[ChatPlan, SpokenAsk]:
        """Everything checked before admission: the output asked for, the speakers, the turns' count and text."""
        self.served.check(body.model)
        modalities = list(body.modalities or ("audio",))
        if "audio" not in modalities:
            raise bad_request("this model speaks its reply: ask for modalities [\"audio\"]", param="modalities",
                              code="audio_required")
        for field, value in (("tools", body.tools), ("n", body.choices > 1), ("logprobs", body.logprobs)):
            if value:
                raise bad_request(f"{field} is not supported by a speech model's chat", param=field)
        audio = audio_output(body, self.engine, self.served, modalities)
        plan = ChatPlan(audio, "text" in modalities, tool_setup(None, None, None), 1, TemplateOptions(), None)
        ask = self._ask(body, audio.voice)
        check_turns(ask.turns, self.inputs.speech, self.limits)
        return plan, ask

    async def request(self, ask: SpokenAsk, stream: bool) -> OmniRequest:
        request = await self.inputs.request(ask.speech, ask.turns)
        return replace(request, request_id=f"chatcmpl-{uuid.uuid4().hex}", stream=stream)

    def _ask(self, body: ChatCompletionRequest, voice: str) -> SpokenAsk:
        said = [(i, m) for i, m in enumerate(body.messages) if m.role not in _SKIPPED]
        if not said:
            raise bad_request("give the text to speak as the last message", param="messages")
        last_index, last = said[-1]
        text, audio = _parts(last, f"messages[{last_index}]")
        if audio is not None or not text:
            raise bad_request("the last message is what is spoken: its text, without audio",
                              param=f"messages[{last_index}].content")
        speaker = self._speaker(last, voice, f"messages[{last_index}]")
        turns = tuple(self._turn(i, m, speaker) for i, m in said[:-1])
        cap = body.max_completion_tokens or body.max_tokens
        return SpokenAsk(SpeechRequest(model=body.model, input=text, voice=speaker, max_new_tokens=cap), turns)

    def _turn(self, index: int, message: ChatMessage, reply_speaker: str) -> TurnAsked:
        param = f"messages[{index}]"
        if message.role not in ("user", "assistant"):
            raise bad_request(f"a {message.role} message cannot be a turn of the conversation", param=f"{param}.role")
        if message.audio is not None:
            raise bad_request("this server keeps no audio to refer to by id: send the turn's audio as an "
                              "input_audio part", param=f"{param}.audio", code="invalid_audio")
        text, audio = _parts(message, param)
        if audio is None or not text:
            raise bad_request("each earlier message is a turn: one text part and one audio part",
                              param=f"{param}.content")
        others = [s for s in self.inputs.speech.speakers if s != reply_speaker]
        side = reply_speaker if message.role == "assistant" or not others else others[0]
        return TurnAsked(self._speaker(message, side, param), text, audio, param)

    def _speaker(self, message: ChatMessage, default: str, param: str) -> str:
        """The message's ``name``, one of the speakers; ``default`` without one."""
        if message.name is None:
            return default
        if message.name not in self.inputs.speech.speakers:
            raise bad_request(f"unknown speaker {message.name!r}; this model's are "
                              f"{', '.join(self.inputs.speech.speakers)}", param=f"{param}.name",
                              code="invalid_speaker")
        return message.name


def _parts(message: ChatMessage, param: str) -> tuple[str, str | None]:
    """A message's text, and its one audio part as a media URL (None: none)."""
    if message.content is None or isinstance(message.content, str):
        return (message.content or "").strip(), None
    texts, audios = [], []
    for part in message.content:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, InputAudioPart):
            audios.append(f"data:audio/{part.input_audio.format};base64,{part.input_audio.data}")
        elif isinstance(part, AudioURLPart):
            audios.append(part.audio_url.url)
        else:
            raise bad_request("a speech model hears text and audio only", param=f"{param}.content")
    if len(audios) > 1:
        raise bad_request("one audio part a message", param=f"{param}.content")
    return " ".join(texts).strip(), audios[0] if audios else None


def spoken_chat(engine: OmniEngine, served: ServedModel, inputs: object, limits: ServerLimits) -> SpokenChat | None:
    """The spoken chat of a served speech model that takes a conversation's context (None for any other)."""
    if engine.front_end.processor is not None or not isinstance(inputs, TextToSpeech):
        return None
    return SpokenChat(engine, served, inputs, limits) if inputs.speech.takes_context else None
