"""A FakeEngine with the real prompt processor (tokenizer + config only, no weights) behind a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

# Small enough that the error tests can cross them cheaply.
TEST_LIMITS = ServerLimits(max_audio_seconds=5.0, max_base64_bytes=2_000_000, max_media_bytes=2_000_000,
                           max_image_pixels=512 * 512, max_text_chars=2000, max_speech_input_chars=200,
                           max_media_items=4, max_video_frames=3, max_request_bytes=4_000_000)


@pytest.fixture(scope="session")
def processor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's tokenizer and config, without its weights (fast to make)."""
    from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
    from omnistage.families.qwen3_omni.make_tiny import BPE_SIZE, _role_ids
    from omnistage.families.qwen3_omni.checkpoint_config import checkpoint_config_dict
    from omnistage.tiny.tokenizer import save_tokenizer

    out = tmp_path_factory.mktemp("processor")
    layout = save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)
    (out / "config.json").write_text(json.dumps(checkpoint_config_dict(layout, _role_ids(out))))
    return out


@pytest.fixture(scope="session")
def processor(processor_dir: Path) -> RecordingProcessor:
    return RecordingProcessor.from_folder(processor_dir)


@dataclass
class LiveServer:
    base_url: str
    engine: FakeEngine
    media_dir: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=20)


@pytest.fixture(scope="session")
def live_server(processor: RecordingProcessor, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    media_dir = tmp_path_factory.mktemp("media")
    engine = FakeEngine(fake_front_end(processor))
    app = build_app(engine, TEST_LIMITS, MediaPolicy(allowed_local_media_path=media_dir))
    thread = ServerThread(app)
    base_url = thread.start()
    yield LiveServer(base_url, engine, media_dir.resolve())
    thread.stop()


@pytest.fixture()
def server(live_server: LiveServer, processor: RecordingProcessor) -> LiveServer:
    live_server.engine.reset()
    processor.seen_audios.clear()
    processor.seen_images.clear()
    processor.seen_videos.clear()
    return live_server
