"""pipecat 1.14 against a live server: ``OpenAIRealtimeLLMService`` fed PCM frames with server VAD,
``OpenAILLMService`` with penalties and a tool round trip, ``OpenAITTSService`` with an OpenAI voice name."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    LLMTextFrame,
    ProposedUserStoppedSpeakingFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.workers.runner import WorkerRunner

from tests.audio.signals import peak_hz, speech_like
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import SINE_HZ
from tests.entrypoints.test_chat_compat import CALL_WORDS

pytestmark = pytest.mark.e2e
TIMEOUT_S = 30.0
RATE = 24000  # pipecat's (and OpenAI's) realtime and TTS rate


class Collector(FrameProcessor):
    """Keeps every frame travelling ``direction`` past it; ``until`` waits for ``count`` of a type."""

    def __init__(self, direction: FrameDirection) -> None:
        super().__init__()
        self.direction = direction
        self.frames: list[Frame] = []
        self._changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.frames.append(frame)
            self._changed.set()
        await self.push_frame(frame, direction)

    def count(self, kind: type) -> int:
        return sum(isinstance(f, kind) for f in self.frames)

    async def until(self, kind: type, count: int) -> None:
        while self.count(kind) < count:
            self._changed.clear()
            await self._changed.wait()


async def drive(processors: list[FrameProcessor], frames: list[Frame], until: type, count: int = 1,
                watch: Collector | None = None) -> tuple[list[Frame], list[Frame]]:
    """Runs ``processors`` as a pipeline, queues ``frames``, waits for ``count`` frames of type ``until`` to pass
    ``watch`` (default: the pipeline's end); returns the frames that left it downstream and those that reached its
    start upstream (errors)."""
    up, down = Collector(FrameDirection.UPSTREAM), Collector(FrameDirection.DOWNSTREAM)
    watch = watch or down
    worker = PipelineWorker(Pipeline([up, *processors, down]), params=PipelineParams(),
                            cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(*_: object) -> None:
        started.set()

    async def scenario() -> None:
        try:
            await asyncio.wait_for(started.wait(), TIMEOUT_S)
            for frame in frames:
                await worker.queue_frame(frame)
                if isinstance(frame, InputAudioRawFrame):
                    await asyncio.sleep(0.001)  # a little like a microphone: the pipeline keeps pace
            await asyncio.wait_for(watch.until(until, count), TIMEOUT_S)
        except BaseException:
            await worker.cancel()  # a failing test ends the pipeline too
            raise
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), scenario())
    return down.frames, up.frames


def errors(frames: list[Frame]) -> list[str]:
    return [f.error for f in frames if isinstance(f, ErrorFrame)]


def pcm_frames(samples: np.ndarray, ms: int = 20) -> list[InputAudioRawFrame]:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    step = RATE * ms // 1000 * 2
    return [InputAudioRawFrame(audio=pcm[i:i + step], sample_rate=RATE, num_channels=1)
            for i in range(0, len(pcm), step)]


def pcm_of(frames: list[Frame]) -> np.ndarray:
    audio = b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))
    return np.frombuffer(audio, "<i2").astype(np.float32) / 32767


def test_realtime_service_with_server_vad_hears_the_turn_and_plays_the_answer(server: LiveServer,
                                                                              processor) -> None:  # noqa: ANN001
    """pipecat greets (a response on the initial context), then PCM frames of a spoken turn reach the server's
    VAD (Silero), which commits the turn and answers it: both answers' audio reaches the pipeline."""
    speech = np.concatenate([np.zeros(RATE // 2, np.float32), speech_like(0.8, RATE), np.zeros(RATE, np.float32)])
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    service = OpenAIRealtimeLLMService(api_key="unused", base_url=url, settings=OpenAIRealtimeLLMService.Settings(
        model=server.engine.model_name, system_instruction="You are a helpful assistant."))
    down, up = asyncio.run(drive([service], [LLMContextFrame(LLMContext()), *pcm_frames(speech)],
                                 LLMFullResponseEndFrame, count=2))
    assert errors(up) == []
    stopped = next(i for i, f in enumerate(down) if isinstance(f, ProposedUserStoppedSpeakingFrame))
    answer = pcm_of(down[stopped:])
    assert len(answer) > 0 and abs(peak_hz(answer, RATE) - SINE_HZ) < 5  # the fake engine's voice
    assert all(f.sample_rate == RATE for f in down if isinstance(f, TTSAudioRawFrame))
    assert "".join(f.text for f in down[stopped:] if isinstance(f, LLMTextFrame)) == "Hello from the fake engine."
    # The committed turn at 16 kHz: 300 ms of padding, 0.8 s of vowels, and the silence up to the pause the
    # server's speculative reply started at (200 ms of it, and the VAD's lag), not the 500 ms that ended the turn:
    # the reply answers exactly the committed audio (realtime/speculation.py).
    assert 1.2 * 16000 < len(processor.seen_audios[-1]) < 1.5 * 16000
    assert server.engine.requests[-1].wants_audio


WEATHER = FunctionSchema(name="get_weather", description="the weather in a city",
                         properties={"city": {"type": "string"}}, required=["city"])


def test_llm_service_with_penalties_and_a_tool_round_trip(server: LiveServer) -> None:
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        server.engine.words = ("It", " is", " sunny.")
        await params.result_callback({"sky": "sunny"})

    llm = OpenAILLMService(api_key="unused", base_url=f"{server.base_url}/v1", settings=OpenAILLMService.Settings(
        model=server.engine.model_name, frequency_penalty=0.5, presence_penalty=0.25, temperature=0.0))
    llm.register_function("get_weather", get_weather)
    context = LLMContext(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=ToolsSchema([WEATHER]))
    pair = LLMContextAggregatorPair(context)
    server.engine.words = CALL_WORDS
    answers = Collector(FrameDirection.DOWNSTREAM)  # the assistant aggregator keeps the response frames
    down, up = asyncio.run(drive([pair.user(), llm, answers, pair.assistant()], [LLMRunFrame()],
                                 LLMFullResponseEndFrame, count=2, watch=answers))
    assert errors(up) == []
    assert calls == [{"city": "Paris"}]
    first, second = server.engine.requests[-2:]
    assert (first.sampling.frequency_penalty, first.sampling.presence_penalty) == (0.5, 0.25)
    rendered = server.engine.front_end.processor.tokenizer.decode(second.prompt.token_ids)
    assert '"get_weather"' in rendered and '{"sky": "sunny"}' in rendered  # the result went back to the model
    assert context.get_messages()[-1] == {"role": "assistant", "content": "It is sunny."}


def test_realtime_service_function_call_round_trip(server: LiveServer) -> None:
    """Context tools become session tools; the call runs pipecat's handler, whose result goes back as a
    function_call_output item and the next response answers from it."""
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        server.engine.words = ("It", " is", " sunny.")
        await params.result_callback({"sky": "sunny"})

    url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    service = OpenAIRealtimeLLMService(api_key="unused", base_url=url, settings=OpenAIRealtimeLLMService.Settings(
        model=server.engine.model_name))
    service.register_function("get_weather", get_weather)
    context = LLMContext(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=ToolsSchema([WEATHER]))
    pair = LLMContextAggregatorPair(context)
    answers = Collector(FrameDirection.DOWNSTREAM)
    server.engine.words = CALL_WORDS
    down, up = asyncio.run(drive([pair.user(), service, answers, pair.assistant()], [LLMRunFrame()],
                                 LLMFullResponseEndFrame, count=2, watch=answers))
    assert errors(up) == []
    assert calls == [{"city": "Paris"}]
    assert "".join(f.text for f in answers.frames if isinstance(f, LLMTextFrame)).endswith("It is sunny.")
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert '"get_weather"' in rendered and '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in rendered


@pytest.mark.parametrize("voice", ["alloy", "marin"])
def test_tts_service_speaks_with_an_openai_voice(server: LiveServer, voice: str) -> None:
    tts = OpenAITTSService(api_key="unused", base_url=f"{server.base_url}/v1", sample_rate=RATE,
                           settings=OpenAITTSService.Settings(model=server.engine.model_name, voice=voice))
    down, up = asyncio.run(drive([tts], [TTSSpeakFrame("Hello there.")], TTSStoppedFrame))
    assert errors(up) == []
    audio = pcm_of(down)
    assert len(audio) > RATE // 10 and abs(peak_hz(audio, RATE) - SINE_HZ) < 5
    request = server.engine.requests[-1]
    assert request.wants_audio and request.voice in server.engine.front_end.voices
