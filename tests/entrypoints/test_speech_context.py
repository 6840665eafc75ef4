"""The context checks made before admission, on any served model: a model that takes no context refuses it, and a
conversational one bounds the turn count, each speaker and the text (400s naming the turn)."""

from __future__ import annotations

import pytest

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.speech.context import TurnAsked, check_turns
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd


class Talker(SpeechFrontEnd):
    speakers = ("0", "1")

    def prompt(self, ask: SpeechAsk) -> object:
        raise NotImplementedError

    def max_frames(self, prompt: object, room: int) -> int:
        return room


class Conversational(Talker):
    takes_context = True


def _turns(n: int, speaker: str = "0", text: str = "hi") -> list[TurnAsked]:
    return [TurnAsked(speaker, text, "data:audio/wav;base64,", f"context[{i}]") for i in range(n)]


def _refused(turns: list[TurnAsked], speech: SpeechFrontEnd | None, **limits: float) -> APIError:
    with pytest.raises(APIError) as caught:
        check_turns(turns, speech, ServerLimits(**limits))
    assert caught.value.status_code == 400
    return caught.value


def test_a_model_without_context_refuses_it() -> None:
    check_turns([], Talker(), ServerLimits())  # none given: nothing to refuse
    for speech in (None, Talker()):
        assert _refused(_turns(1), speech).detail.code == "context_not_supported"


def test_turns_speakers_and_text_are_bounded() -> None:
    check_turns(_turns(3), Conversational(), ServerLimits(max_speech_context_turns=3))
    assert "--max-speech-context-turns" in _refused(_turns(4), Conversational(), max_speech_context_turns=3).detail.message
    error = _refused(_turns(2, speaker="7"), Conversational())
    assert (error.detail.param, error.detail.code) == ("context[0].speaker", "invalid_speaker")
    error = _refused(_turns(2, text="x" * 60), Conversational(), max_speech_input_chars=100)
    assert (error.detail.param, error.detail.code) == ("context[1]", "input_too_long")
