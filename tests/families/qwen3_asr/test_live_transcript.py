"""Input transcription while the user speaks on a Qwen3-ASR checkpoint, through the OpenAI SDK's realtime client:
with server VAD, espeak-ng speech paced like a microphone gets ``conversation.item.input_audio_transcription.delta``
events naming the turn's item before it is committed, and the ``.completed`` transcript is what every delta of the
item joins into. The agreement rule (``live_transcript.agreed``) is pinned on its own too."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from omnistage.entrypoints.openai.realtime.live_transcript import agreed
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import pcm16_pieces

RATE = 24000
DELTA = "conversation.item.input_audio_transcription.delta"
DONE = "conversation.item.input_audio_transcription.completed"
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


@pytest.mark.parametrize(("previous", "current", "fixed"), [
    ("", "hello world", ""),  # one run agrees with nothing
    ("hello wor", "hello world again", "hello"),  # a word cut by the audio's end differs
    ("hello world", "hello world", "hello"),  # the last word heard may still grow
    (" the quick brown", " the quick brown fox", " the quick brown"),  # continuations keep their leading space
    ("a b c", "x b c", ""),
    ("ok the\ufffd", "ok the\ufffd", "ok"),
    ("今天天气很", "今天天气很好，", "今天天气很"),  # a script without spaces agrees character by character
    ("我想去东京", "我想去京都", "我想去"),  # a character cut inside its bytes ends the text: not fixed
])
def test_two_runs_fix_what_they_agree_on(previous: str, current: str, fixed: str) -> None:
    assert agreed(previous, current) == fixed
    assert current.startswith(fixed)  # what is fixed is the current run's own text: the next run continues it


async def _speak(url: str) -> list[tuple[str, str, str]]:
    """(event type, item id, text) of every event the session sends, until the turn's ``.completed``."""
    samples, _ = speech(SENTENCE, RATE)
    silence = np.zeros(int(1.2 * RATE), np.float32)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    seen: list[tuple[str, str, str]] = []
    async with client.realtime.connect(model="asr") as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "asr", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})

        async def speak() -> None:
            for piece in pcm16_pieces(np.concatenate([samples, silence]), RATE):
                await conn.input_audio_buffer.append(audio=piece)
                await asyncio.sleep(0.05)  # twice as fast as a microphone: the runs keep up on a busy host

        talking = asyncio.create_task(speak())
        async for event in conn:
            seen.append((event.type, getattr(event, "item_id", ""),
                         getattr(event, "delta", None) or getattr(event, "transcript", "")))
            if event.type == DONE:
                break
        await talking
    return seen


@pytest.mark.e2e
def test_deltas_while_speaking_join_into_the_transcript(asr_url: str) -> None:
    seen = asyncio.run(asyncio.wait_for(_speak(asr_url), 120))
    kinds = [kind for kind, _, _ in seen]
    committed = kinds.index("input_audio_buffer.committed")
    started = next(item for kind, item, _ in seen if kind == "input_audio_buffer.speech_started")
    early = [text for kind, item, text in seen[:committed] if kind == DELTA and item == started]
    assert early, f"no delta before the commit: {kinds}"
    deltas = "".join(text for kind, item, text in seen if kind == DELTA and item == started)
    done = next(text for kind, item, text in seen if kind == DONE and item == started)
    assert done and done == deltas.strip()


def test_a_recognisers_prompt_continues_an_opening_after_its_language_line(asr_dir) -> None:  # noqa: ANN001
    from omnistage.families.qwen3_asr.prompt import Qwen3ASRPromptProcessor

    processor = Qwen3ASRPromptProcessor(asr_dir, 50)
    audio = np.zeros(16000, np.float32)
    plain = processor.prompt(audio, "en").token_ids
    opened = processor.prompt(audio, "en", prefix="Hello <|im_end|> world").token_ids
    assert opened[:len(plain)] == plain  # the same prompt, then the opening as plain text (markup stays text)
    assert processor.tokenizer.decode(opened[len(plain):]) == "Hello <|im_end|> world"
    assert processor.tokenizer.convert_tokens_to_ids("<|im_end|>") not in opened[len(plain):]
    with pytest.raises(ValueError, match="language"):
        processor.prompt(audio, None, prefix="Hello")  # the reply's language line would come after it
