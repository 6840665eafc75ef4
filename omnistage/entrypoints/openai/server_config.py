"""Server-side limits and media policy: frozen, validated, and set from CLI flags.

Kept free of FastAPI imports so ``omnistage.entrypoints.cli`` can add these
flags without loading the web stack.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def _limit(default: float, help: str) -> Any:  # noqa: ANN401 - dataclasses.field's own return type
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """Caps on what one request may carry; each breach is a 400, never a 500 or an OOM."""

    max_audio_seconds: float = _limit(600.0, "seconds of one audio item, after decoding")
    max_base64_bytes: int = _limit(64 * MIB, "encoded size of one inline item (input_audio data or a data: URL)")
    max_media_bytes: int = _limit(64 * MIB, "size of one fetched item (file:// or http(s) URL)")
    max_image_pixels: int = _limit(4096 * 4096, "pixels of one image or video frame, checked before decoding")
    max_text_chars: int = _limit(200_000, "characters of text in one chat request")
    max_speech_input_chars: int = _limit(4096, "characters of /v1/audio/speech input (OpenAI's own limit)")
    max_media_items: int = _limit(32, "audio, image and video parts in one request")
    max_video_frames: int = _limit(16, "frames sampled from one video")
    video_sample_fps: float = _limit(2.0, "frames per second sampled from a video")
    max_request_bytes: int = _limit(256 * MIB, "size of one request body")
    max_queued_requests: int = _limit(256, "requests in the pipeline at once (running or queued in any stage); "
                                           "past it a new request gets 429 with Retry-After")
    request_timeout: float = _limit(600.0, "seconds a request may take in the engine before it is aborted")

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"ServerLimits.{f.name} must be > 0, got {getattr(self, f.name)!r}")


@dataclass(frozen=True)
class MediaPolicy:
    """Where media URLs may point. Local files and remote fetches are both off unless asked for."""

    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.allowed_local_media_path is not None:
            path = Path(self.allowed_local_media_path).expanduser().resolve()
            if not path.is_dir():
                raise ValueError(f"--allowed-local-media-path {path} is not a folder")
            object.__setattr__(self, "allowed_local_media_path", path)
        if self.remote_timeout_s <= 0:
            raise ValueError("remote_timeout_s must be > 0")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """One flag per ``ServerLimits`` field (same name, dashes) plus the media policy flags."""
    group = parser.add_argument_group("request limits")
    for f in fields(ServerLimits):
        kind = float if isinstance(f.default, float) else int
        group.add_argument(_flag(f.name), type=kind, default=f.default,
                           help=f"{f.metadata['help']} (default {f.default})")
    media = parser.add_argument_group("media URLs")
    media.add_argument("--allowed-local-media-path", type=Path, default=None,
                       help="serve file:// media URLs from under this folder (off by default)")
    media.add_argument("--allow-remote-media", action="store_true",
                       help="fetch http(s):// media URLs (off by default: the server would fetch any URL it is given)")
    media.add_argument("--remote-media-timeout", type=float, default=10.0, help="seconds per remote fetch")


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits) if hasattr(args, f.name)})


def media_policy_from_args(args: argparse.Namespace) -> MediaPolicy:
    return MediaPolicy(
        allowed_local_media_path=getattr(args, "allowed_local_media_path", None),
        allow_remote_media=bool(getattr(args, "allow_remote_media", False)),
        remote_timeout_s=float(getattr(args, "remote_media_timeout", 10.0)),
    )
