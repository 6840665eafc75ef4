"""/v1/chat/completions through the official openai client: text, speech, streaming, sampling fields."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf

from omnistage.core import FinishReason, Modality
from tests.audio.signals import av_decode, peak_hz
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import WORDS

USER = [{"role": "user", "content": "Say hello."}]
TEXT = "".join(WORDS)


def test_text_only(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(model="fake-omni", messages=USER)
    choice = reply.choices[0]
    assert choice.message.content == TEXT
    assert choice.message.audio is None
    assert choice.finish_reason == "stop"
    assert reply.object == "chat.completion" and reply.model == "fake-omni"
    assert reply.usage.completion_tokens == len(WORDS)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + len(WORDS)
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # OpenAI's field; the fake engine caches nothing
    request = server.engine.requests[-1]
    assert request.modalities == frozenset({Modality.TEXT})
    assert reply.id == request.request_id


def test_text_and_audio_wav(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(
        model="fake-omni", messages=USER, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"})
    message = reply.choices[0].message
    assert message.content == TEXT
    assert message.audio.transcript == TEXT
    assert message.audio.id.startswith("audio_") and message.audio.expires_at > 0
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000
    assert len(samples) == len(WORDS) * 2400
    assert abs(peak_hz(samples, rate) - 440) < 5
    # The voice is matched case-insensitively and handed over in the engine's spelling.
    assert server.engine.requests[-1].voice == "Ethan"
    assert server.engine.requests[-1].wants_audio


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac", "pcm16"])
def test_other_output_formats(server: LiveServer, fmt: str) -> None:
    reply = server.client().chat.completions.create(
        model="fake-omni", messages=USER, modalities=["text", "audio"], audio={"voice": "Chelsie", "format": fmt})
    data = base64.b64decode(reply.choices[0].message.audio.data)
    if fmt == "pcm16":
        samples, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32767, 24000
        assert len(samples) == len(WORDS) * 2400
    else:
        samples, rate = av_decode(data)
    assert abs(peak_hz(samples, rate) - 440) < 5


def test_voice_object_form(server: LiveServer) -> None:
    server.client().chat.completions.create(
        model="fake-omni", messages=USER, modalities=["text", "audio"],
        audio={"voice": {"id": "AIDEN"}, "format": "wav"})
    assert server.engine.requests[-1].voice == "Aiden"


def test_streaming_text_with_usage(server: LiveServer) -> None:
    stream = server.client().chat.completions.create(
        model="fake-omni", messages=USER, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(WORDS)
    assert all(c.choices[0].delta.audio is None for c in chunks if c.choices)


def test_streaming_without_usage_has_no_usage_chunk(server: LiveServer) -> None:
    chunks = list(server.client().chat.completions.create(model="fake-omni", messages=USER, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def _stream_audio(server: LiveServer, fmt: str) -> tuple[bytes, str, list[str]]:
    stream = server.client().chat.completions.create(
        model="fake-omni", messages=USER, stream=True, modalities=["text", "audio"],
        audio={"voice": "ethan", "format": fmt})
    data, transcript, ids = b"", "", []
    for chunk in stream:
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio is None:
            continue
        audio = audio if isinstance(audio, dict) else audio.model_dump()
        ids.append(audio.get("id"))
        data += base64.b64decode(audio.get("data") or "")
        transcript += audio.get("transcript") or ""
    return data, transcript, ids


@pytest.mark.parametrize("fmt", ["pcm16", "wav"])
def test_streaming_audio_as_pcm16_chunks(server: LiveServer, fmt: str) -> None:
    data, transcript, ids = _stream_audio(server, fmt)
    samples = np.frombuffer(data, "<i2").astype(np.float32) / 32767
    assert len(samples) == len(WORDS) * 2400
    assert abs(peak_hz(samples, 24000) - 440) < 5
    assert transcript == TEXT
    assert len(set(ids)) == 1 and ids[0].startswith("audio_")


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac"])
def test_streaming_compressed_chunks_concatenate_to_a_file(server: LiveServer, fmt: str) -> None:
    data, _, _ = _stream_audio(server, fmt)
    samples, rate = av_decode(data)
    assert len(samples) >= 0.9 * len(WORDS) * 0.1 * rate
    assert abs(peak_hz(samples, rate) - 440) < 5


def test_streamed_flac_equals_the_whole_response(server: LiveServer) -> None:
    """Concatenated streamed FLAC deltas are one file python-soundfile reads whole, sample for sample."""
    streamed, _, _ = _stream_audio(server, "flac")
    reply = server.client().chat.completions.create(
        model="fake-omni", messages=USER, modalities=["text", "audio"], audio={"voice": "ethan", "format": "flac"})
    whole, rate = sf.read(io.BytesIO(base64.b64decode(reply.choices[0].message.audio.data)), dtype="int16")
    samples, streamed_rate = sf.read(io.BytesIO(streamed), dtype="int16")
    assert rate == streamed_rate == 24000 and len(samples) == len(WORDS) * 2400
    np.testing.assert_array_equal(samples, whole)
    pcm, _, _ = _stream_audio(server, "pcm16")
    np.testing.assert_array_equal(samples, np.frombuffer(pcm, "<i2"))


def test_sampling_fields_reach_the_engine(server: LiveServer) -> None:
    server.client().chat.completions.create(
        model="fake-omni", messages=USER, temperature=0.3, top_p=0.9, max_completion_tokens=3, seed=7,
        stop=["\n", "END"], n=1, extra_body={"top_k": 5, "repetition_penalty": 1.1})
    sampling = server.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed) == (0.3, 0.9, 3, 7)
    assert sampling.stop == ("\n", "END") and sampling.top_k == 5 and sampling.repetition_penalty == 1.1


def test_first_audio_chunk_size_reaches_the_engine(server: LiveServer) -> None:
    server.client().chat.completions.create(
        model="fake-omni", messages=USER, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"},
        extra_body={"initial_codec_chunk_frames": 4})
    assert server.engine.requests[-1].initial_codec_chunk_frames == 4
    server.client().chat.completions.create(model="fake-omni", messages=USER)
    assert server.engine.requests[-1].initial_codec_chunk_frames is None  # the pipeline chooses by load


def test_max_tokens_truncates_with_length(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(model="fake-omni", messages=USER, max_tokens=2, stop="x")
    assert reply.choices[0].message.content == "".join(WORDS[:2])
    assert reply.choices[0].finish_reason == "length"
    assert server.engine.requests[-1].sampling.stop == ("x",)


def test_default_budget_is_the_rest_of_the_context(server: LiveServer) -> None:
    server.client().chat.completions.create(model="fake-omni", messages=USER)
    request = server.engine.requests[-1]
    assert request.sampling.max_tokens == server.engine.max_model_len - len(request.prompt.token_ids)


def test_system_developer_and_assistant_turns(server: LiveServer, processor) -> None:  # noqa: ANN001
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": None, "audio": {"id": "audio_123"}},
        {"role": "user", "content": "Again"},
    ]
    server.client().chat.completions.create(model="fake-omni", messages=messages)
    text = processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_engine_failure_is_a_server_error(server: LiveServer) -> None:
    import openai

    server.engine.fail_with = "talker replica 0 died"
    with pytest.raises(openai.InternalServerError) as info:
        server.client().chat.completions.create(model="fake-omni", messages=USER)
    assert "talker replica 0 died" in info.value.body["message"] and info.value.body["code"] == "engine_error"
    with pytest.raises(openai.APIError, match="talker replica 0 died"):
        list(server.client().chat.completions.create(model="fake-omni", messages=USER, stream=True))


def test_finish_reasons_map(server: LiveServer) -> None:
    from omnistage.entrypoints.openai.chat.stream import finish_reason_name

    assert finish_reason_name(FinishReason.LENGTH) == "length"
    assert finish_reason_name(FinishReason.STOP) == "stop"


@pytest.mark.parametrize("text", [" hello", 'quote " and \\ backslash', "ünïcødé ✓ 中文", "\n\ttabs\x01"])
@pytest.mark.parametrize(("with_text", "with_audio"), [(True, True), (True, False), (False, True)])
def test_a_text_delta_chunk_is_the_models_json(text: str, with_text: bool, with_audio: bool) -> None:
    """The per-token fast path writes what the chunk models would: the same JSON, once parsed."""
    import json as json_module

    from omnistage.audio.formats import AudioFormat
    from omnistage.core import OmniOutput
    from omnistage.entrypoints.openai.chat.protocol import ChatCompletionChunk, ChoiceDelta, ChunkChoice, DeltaAudio
    from omnistage.entrypoints.openai.chat.request import AudioOutput, ChatPlan
    from omnistage.entrypoints.openai.chat.stream import ChunkWriter
    from omnistage.entrypoints.openai.common.streaming import sse_event
    from omnistage.entrypoints.openai.common.tool_calls import tool_setup
    from omnistage.entrypoints.openai.media.prompt_builder import TemplateOptions

    audio = AudioOutput("Ethan", AudioFormat.PCM16, 24000) if with_audio else None
    plan = ChatPlan(audio, with_text, tool_setup(None, None, None), 1, TemplateOptions(), None)
    writer = ChunkWriter('chat"cmpl-1', "tiny ✓", plan, None)
    [fast] = writer.output(0, OmniOutput("r", text=text, token_ids=(5,)))
    transcript = DeltaAudio(id=writer.choices[0].audio_id, transcript=text) if with_audio else None
    model = ChatCompletionChunk(id='chat"cmpl-1', created=writer.created, model="tiny ✓", modality="text",
                                choices=[ChunkChoice(index=0, delta=ChoiceDelta(content=text if with_text else None,
                                                                                audio=transcript))])
    slow = sse_event(model)
    assert fast.startswith("data: ") and fast.endswith("\n\n")
    assert json_module.loads(fast[6:]) == json_module.loads(slow[6:])


def test_an_audio_chunk_is_the_models_json() -> None:
    import json as json_module

    import numpy as np

    from omnistage.audio.formats import AudioFormat
    from omnistage.core import OmniOutput
    from omnistage.entrypoints.openai.chat.protocol import ChatCompletionChunk, ChoiceDelta, ChunkChoice, DeltaAudio
    from omnistage.entrypoints.openai.chat.request import AudioOutput, ChatPlan
    from omnistage.entrypoints.openai.chat.stream import ChunkWriter
    from omnistage.entrypoints.openai.common.streaming import sse_event
    from omnistage.entrypoints.openai.common.tool_calls import tool_setup
    from omnistage.entrypoints.openai.media.prompt_builder import TemplateOptions

    plan = ChatPlan(AudioOutput("Ethan", AudioFormat.PCM16, 24000), True, tool_setup(None, None, None), 1,
                    TemplateOptions(), None)
    writer = ChunkWriter("chatcmpl-1", "tiny", plan, None)
    samples = np.sin(np.arange(480) / 7).astype(np.float32)
    [fast] = writer.output(0, OmniOutput("r", audio=samples))
    data = json_module.loads(fast[6:])["choices"][0]["delta"]["audio"]["data"]
    delta = ChoiceDelta(audio=DeltaAudio(id=writer.choices[0].audio_id, data=data))
    slow = sse_event(ChatCompletionChunk(id="chatcmpl-1", created=writer.created, model="tiny", modality="audio",
                                         choices=[ChunkChoice(index=0, delta=delta)]))
    assert json_module.loads(fast[6:]) == json_module.loads(slow[6:])
    assert len(base64.b64decode(data)) == 2 * 480  # PCM16 of every sample
