"""Limits and media policy from CLI flags, the engine Protocol, and ``omnistage serve`` wiring."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from omnistage.entrypoints.cli import build_parser, main
from omnistage.entrypoints.openai.common.errors import param_path
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import (
    MediaPolicy,
    ServerLimits,
    ServingOptions,
    limits_from_args,
    media_policy_from_args,
    serving_options_from_args,
)
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end


def test_limits_reject_non_positive_values() -> None:
    with pytest.raises(ValueError, match="max_audio_seconds"):
        ServerLimits(max_audio_seconds=0)
    with pytest.raises(ValueError, match="max_text_chars"):
        ServerLimits(max_text_chars=-1)


def test_limits_are_frozen() -> None:
    with pytest.raises(AttributeError):
        ServerLimits().max_text_chars = 5  # type: ignore[misc]


def test_serve_flags_set_limits_and_media_policy(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "serve", "--model", "tiny", "--max-audio-seconds", "30", "--max-image-pixels", "1000",
        "--allowed-local-media-path", str(tmp_path), "--allow-remote-media",
    ])
    limits = limits_from_args(args)
    assert limits.max_audio_seconds == 30.0 and limits.max_image_pixels == 1000
    assert limits.max_text_chars == ServerLimits().max_text_chars
    media = media_policy_from_args(args)
    assert media.allowed_local_media_path == tmp_path.resolve() and media.allow_remote_media


def test_vad_flag_chooses_the_realtime_detector(processor: RecordingProcessor) -> None:
    from omnistage.entrypoints.openai.api_server import build_app

    assert serving_options_from_args(build_parser().parse_args(["serve"])).vad == "auto"
    options = serving_options_from_args(build_parser().parse_args(["serve", "--vad", "energy"]))
    assert options.vad == "energy"
    assert build_app(FakeEngine(fake_front_end(processor)), serving=options).state.realtime.vad.name == "energy"
    assert build_app(FakeEngine(fake_front_end(processor))).state.realtime.vad.name == "silero"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--vad", "webrtc"])
    with pytest.raises(ValueError, match="--vad"):
        ServingOptions(vad="webrtc")


def test_media_policy_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        MediaPolicy(allowed_local_media_path=tmp_path / "missing")
    assert MediaPolicy().allowed_local_media_path is None and not MediaPolicy().allow_remote_media


def test_param_paths_drop_pydantic_union_labels() -> None:
    loc = ("body", "messages", 0, "content", "list[tagged-union[TextPart,InputAudioPart]]", 2, "input_audio",
           "input_audio", "data")
    assert param_path(loc) == "messages[0].content[2].input_audio.data"
    assert param_path(("body", "audio", "voice", "VoiceRef", "id")) == "audio.voice.id"
    assert param_path(("body",)) is None


def test_fake_engine_satisfies_the_protocol(processor: RecordingProcessor) -> None:
    assert isinstance(FakeEngine(fake_front_end(processor)), OmniEngine)


def test_serve_without_the_pipeline_says_the_install_is_incomplete(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "omnistage.pipeline.async_omni", None)  # import now raises ImportError
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("omnistage: error: ") and "async_omni" in err and "pip install" in err


def test_serve_with_bad_limits_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--max-text-chars", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_text_chars" in err


def test_serve_builds_the_engine_serves_shuts_it_down_and_says_it_is_ready(
        monkeypatch: pytest.MonkeyPatch, processor: RecordingProcessor, capsys: pytest.CaptureFixture) -> None:
    import asyncio

    import uvicorn

    engine = FakeEngine(fake_front_end(processor))
    seen: dict[str, object] = {}

    class AsyncOmni:
        @staticmethod
        def from_config(config: object, trace_sink: object = None) -> FakeEngine:
            seen["config"], seen["trace_sink"] = config, trace_sink
            return engine

    async def serve(self: uvicorn.Server, sockets: list[object]) -> None:
        seen["socket"] = sockets[0].getsockname()[1]
        self.started = True
        await asyncio.sleep(0.3)  # the banner is printed once the server has started

    monkeypatch.setitem(sys.modules, "omnistage.pipeline.async_omni", types.SimpleNamespace(AsyncOmni=AsyncOmni))
    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    assert main(["serve", "tiny", "--port", "0", "--served-model-name", "my-omni", "--max-num-seqs", "4"]) == 0
    config = seen["config"]
    assert (config.model, config.model_name, config.overrides.max_num_seqs) == ("tiny", "my-omni", (("", 4),))
    assert engine.shut_down and seen["trace_sink"] is None  # no --otlp-traces-endpoint: nothing traced
    err = capsys.readouterr().err
    port = seen["socket"]
    assert f"omnistage is ready: model 'my-omni' at http://127.0.0.1:{port}/v1" in err
    assert f"curl http://127.0.0.1:{port}/v1/chat/completions" in err and '"model": "my-omni"' in err


def test_the_served_http_protocol_is_httptools() -> None:
    """A declared dependency: uvicorn picks its C parser (a streamed chunk costs the loop ~25 us less than h11's)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from omnistage.entrypoints.openai.common.connection_guard import guarded_http_protocol

    assert issubclass(guarded_http_protocol(15.0, 30.0), HttpToolsProtocol)
