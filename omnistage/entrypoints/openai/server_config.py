"""Server-side limits and media policy: frozen, validated, and set from CLI flags.

Kept free of FastAPI imports so ``omnistage.entrypoints.cli`` can add these
flags without loading the web stack.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
# The speculative reply's pause: long enough that the gaps inside a spoken sentence rarely reach it, short enough
# that the reply's first audio is made during the rest of OpenAI's 500 ms silence wait.
DEFAULT_SPECULATIVE_REPLY_MS = 200


def _limit(default: float, help: str) -> Any:  # noqa: ANN401 - dataclasses.field's own return type
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """Caps on what one request may carry, each checked from headers before any decoding; a breach is a
    400 (413 for the body) naming the limit, never a 500 or an OOM."""

    max_messages: int = _limit(2048, "messages in one chat request (counted before the body is validated)")
    max_audio_seconds: float = _limit(600.0, "seconds of audio in one request, all items together (read from "
                                             "each item's header); also a realtime input buffer's length")
    min_audio_sample_rate: int = _limit(8000, "lowest sample rate an audio item may declare (Hz)")
    max_audio_sample_rate: int = _limit(192_000, "highest sample rate an audio item may declare (Hz)")
    max_base64_bytes: int = _limit(64 * MIB, "encoded size of one inline item (input_audio data or a data: URL)")
    max_media_bytes: int = _limit(64 * MIB, "size of one fetched item (file:// or http(s) URL)")
    max_image_pixels: int = _limit(4096 * 4096, "pixels of one image or video frame, checked before decoding")
    max_total_pixels: int = _limit(4 * 4096 * 4096, "pixels of one request's images and sampled video frames "
                                                    "together")
    max_video_decode_pixels: int = _limit(2**30, "frames x pixels one request's videos may decode (every decoded "
                                                 "frame counts, at least 256x256 each: decoding costs per frame)")
    max_text_chars: int = _limit(200_000, "characters of text in one chat or responses request, all messages "
                                           "together (tool-call arguments included)")
    max_content_parts: int = _limit(4096, "content parts in one request, all messages together (counted before the "
                                          "body is validated)")
    max_tool_calls: int = _limit(256, "tool calls (and function_call items) in one request's history")
    max_tools: int = _limit(512, "tool definitions in one request")
    max_audio_samples: int = _limit(600 * 48_000 * 2, "decoded audio samples in one request: seconds x rate x "
                                                      "channels, all items together (read from each header)")
    max_session_audio_seconds: float = _limit(1200.0, "seconds of committed audio a realtime session keeps across "
                                                      "turns (the oldest audio items are dropped past it)")
    max_speech_input_chars: int = _limit(4096, "characters of /v1/audio/speech input (OpenAI's own limit)")
    max_instructions_chars: int = _limit(16_384, "characters of /v1/audio/speech and realtime instructions")
    max_media_items: int = _limit(32, "audio, image and video parts in one request")
    max_video_frames: int = _limit(16, "frames sampled from one video")
    video_sample_fps: float = _limit(2.0, "frames per second sampled from a video")
    max_request_bytes: int = _limit(256 * MIB, "size of one request body")
    max_queued_requests: int = _limit(256, "requests in the pipeline at once (running or queued in any stage); "
                                           "past it a new request gets 429 with Retry-After")
    request_timeout: float = _limit(600.0, "seconds a request may take in the engine before it is aborted")
    decode_workers: int = _limit(4, "threads decoding and preprocessing admitted requests' media and prompts "
                                    "(a request waits for one; its client leaving cancels the work)")
    send_timeout: float = _limit(30.0, "seconds a streaming client may go without reading before its stream "
                                       "is aborted and its place freed")
    header_timeout: float = _limit(15.0, "seconds a connection may take to send a request's headers")
    body_timeout: float = _limit(60.0, "seconds a request's body may take to arrive in full once its headers are in")
    # Longer than the idle expiry of common clients (httpx and so OpenAI's SDK: 5 s; aiohttp: 15 s), so that they,
    # not the server, close an idle connection: at uvicorn's own 5 s a client reusing one idle for just under 5 s
    # met the server closing it (a reset, httpx's ReadError), ~7% of such reuses on a loaded server (issue 50).
    keep_alive_timeout: float = _limit(30.0, "seconds an idle keep-alive connection is held open for the client's "
                                             "next request")
    body_min_rate: float = _limit(8192.0, "bytes a second a request's body must bring over every 10 s until it is "
                                          "in full")
    max_voice_audio_bytes: int = _limit(10 * MIB, "size of one reference recording a voice is cloned from")
    max_voice_seconds: float = _limit(30.0, "seconds of one reference recording (read from its header)")
    max_voices: int = _limit(256, "voices kept under --voices-dir")
    max_speech_context_turns: int = _limit(16, "earlier turns (context) one /v1/audio/speech or chat request gives "
                                               "a conversational speech model")
    max_speech_context_seconds: float = _limit(120.0, "seconds of those turns' audio, all together (read from "
                                                      "each header, then counted while decoding)")
    max_ws_message_bytes: int = _limit(16 * MIB, "size of one WebSocket message (a realtime or speech-stream "
                                                 "event); past it the socket is closed with 1009")
    max_realtime_sessions: int = _limit(64, "realtime sessions open at once, WebSocket and WebRTC together")
    max_realtime_items: int = _limit(16_384, "conversation items all realtime sessions hold together")
    max_realtime_bytes: int = _limit(1024 * MIB, "bytes of audio and text all realtime sessions hold together "
                                                  "(input buffers, committed audio and its features, item text)")
    realtime_events_per_second: float = _limit(250.0, "client events one realtime session has acted on per second "
                                                      "(two seconds' worth at once); past it an event gets a "
                                                      "rate_limit_exceeded error event")
    ws_idle_timeout: float = _limit(300.0, "seconds a realtime WebSocket may stay silent with no response "
                                           "running before it is closed")
    max_stored_responses: int = _limit(1024, "/v1/responses kept in memory for previous_response_id and GET "
                                             "(least recently used dropped first; store: false keeps none)")
    stored_response_ttl: float = _limit(3600.0, "seconds a stored /v1/responses response is kept after its last use")
    max_stored_response_bytes: int = _limit(512 * MIB, "bytes the stored /v1/responses responses hold together (each "
                                                       "charged its request body and output; least recently used "
                                                       "dropped first)")
    # Under Kubernetes' default 30 s grace period: the server ends what remains itself, before SIGKILL does.
    shutdown_timeout: float = _limit(25.0, "seconds a stopping server (SIGTERM, Ctrl+C) lets requests and sessions "
                                           "in flight finish while refusing new ones with 503; then, or at a "
                                           "second signal, it ends them with an error")

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"ServerLimits.{f.name} must be > 0, got {getattr(self, f.name)!r}")
        if self.min_audio_sample_rate > self.max_audio_sample_rate:
            raise ValueError("ServerLimits.min_audio_sample_rate must be <= max_audio_sample_rate")


@dataclass(frozen=True)
class MediaPolicy:
    """Where media URLs may point. Local files and remote fetches are both off unless asked for; remote
    hosts that resolve to loopback, private, link-local, multicast, reserved or unspecified addresses are
    refused unless named in ``allowed_media_domains``."""

    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_timeout_s: float = 10.0  # the whole fetch: every redirect and the body
    allowed_media_domains: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.allowed_local_media_path is not None:
            path = Path(self.allowed_local_media_path).expanduser().resolve()
            if not path.is_dir():
                raise ValueError(f"--allowed-local-media-path {path} is not a folder")
            object.__setattr__(self, "allowed_local_media_path", path)
        if self.remote_timeout_s <= 0:
            raise ValueError("remote_timeout_s must be > 0")
        object.__setattr__(self, "allowed_media_domains",
                           tuple(d.strip().lower().rstrip(".") for d in self.allowed_media_domains if d.strip()))


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class AccessPolicy:
    """Who may connect: API keys (none: open), whether /metrics needs one, the Origins a WebSocket may come
    from besides the server's own (``*``: any), and the Host names answered (None: any)."""

    api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if any(not k for k in self.api_keys):
            raise ValueError("an API key must not be empty")
        object.__setattr__(self, "allowed_origins", tuple(o.strip().rstrip("/").lower() for o in self.allowed_origins
                                                          if o.strip()))
        if self.allowed_hosts is not None:
            object.__setattr__(self, "allowed_hosts", frozenset(h.strip().lower() for h in self.allowed_hosts))


@dataclass(frozen=True)
class IceServer:
    """A STUN or TURN server WebRTC calls may use to reach peers beyond one network (``--webrtc-stun/turn``)."""

    url: str
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("stun:", "stuns:", "turn:", "turns:")):
            raise ValueError(f"an ICE server URL starts with stun:, stuns:, turn: or turns:, got {self.url!r}")


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@dataclass(frozen=True)
class WebRtcPolicy:
    """What one WebRTC offer (``POST /v1/realtime/calls``) may ask of the server, each bound checked on the offer's
    text before aiortc reads it, and where the server's ICE checks may go: a remote candidate must be a public
    address (as a media URL's host must) or lie in ``allowed_networks``; the others are dropped from the offer."""

    max_calls: int = _limit(64, "calls in progress at once, those being set up included (429 past it)")
    max_offer_bytes: int = _limit(256 * 1024, "size of a call's request body: the SDP offer, or the form with its "
                                              "session part (413 past it, before it is read in full)")
    max_sdp_bytes: int = _limit(32 * 1024, "size of the SDP offer (aiortc's parser costs grow faster than its size)")
    max_media_sections: int = _limit(4, "media sections (m= lines) in one offer")
    max_candidates: int = _limit(32, "ICE candidates in one offer, all media sections together (aiortc pairs them "
                                     "in quadratic time)")
    connect_timeout: float = _limit(10.0, "seconds a call may take to connect (ICE and DTLS) before it is ended "
                                          "and its place freed")
    allowed_networks: tuple[IPNetwork, ...] = ()  # besides public addresses (loopback added when serving on it)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "allowed_networks" and getattr(self, f.name) <= 0:
                raise ValueError(f"--webrtc-{f.name.replace('_', '-')} must be > 0, got {getattr(self, f.name)!r}")
        object.__setattr__(self, "allowed_networks", tuple(ipaddress.ip_network(n, strict=False)
                                                           for n in self.allowed_networks))


@dataclass(frozen=True)
class ServingOptions:
    """What the API calls the model and how it answers by default (not limits: nothing here bounds work).

    served_model_names: the names requests may use (the first is listed first; empty: the engine's own);
    voice_aliases: ``(name, speaker)`` pairs over the OpenAI voice table; default_modalities: the output of a
    chat request that names none (OpenAI's: text); vad: the realtime ``server_vad`` detector (auto, silero,
    energy: ``omnistage/audio/vad_backend.py``); ice_servers: STUN/TURN for WebRTC calls (none: host candidates
    only, enough on loopback and one network)."""

    served_model_names: tuple[str, ...] = ()
    voice_aliases: tuple[tuple[str, str], ...] = ()
    default_modalities: tuple[str, ...] = ("text",)
    voices_dir: Path | None = None  # where cloned voices are kept (None: registration off)
    vad: str = "auto"
    ice_servers: tuple[IceServer, ...] = ()
    streaming_input: bool = True  # realtime: prefill a turn while it is spoken (realtime/listening.py)
    speculative_reply_ms: int = DEFAULT_SPECULATIVE_REPLY_MS  # realtime: a pause that starts the reply early (0: off)
    realtime_first_chunk_frames: int | None = None  # realtime replies' first code2wav chunk (None: the stage's)
    trace_loop_stalls_ms: float = 0.0  # log the threads' stacks when the event loop stalls longer (0: off)

    def __post_init__(self) -> None:
        if self.trace_loop_stalls_ms < 0:
            raise ValueError(f"--trace-loop-stalls-ms must be >= 0, got {self.trace_loop_stalls_ms}")
        if self.speculative_reply_ms < 0:
            raise ValueError(f"--speculative-reply-ms must be >= 0, got {self.speculative_reply_ms}")
        if self.realtime_first_chunk_frames is not None and self.realtime_first_chunk_frames < 1:
            raise ValueError(f"--realtime-first-chunk-frames must be >= 1, got {self.realtime_first_chunk_frames}")
        if self.vad not in ("auto", "silero", "energy"):
            raise ValueError(f"--vad takes auto, silero or energy, got {self.vad!r}")
        if not self.default_modalities or any(m not in ("text", "audio") for m in self.default_modalities):
            raise ValueError(f"--default-modalities takes text and/or audio, got {self.default_modalities}")


def parse_alias(text: str) -> tuple[str, str]:
    """``NAME=SPEAKER`` → the pair (``argparse`` type)."""
    name, sep, speaker = text.partition("=")
    if not sep or not name.strip() or not speaker.strip():
        raise ValueError(f"a voice alias is NAME=SPEAKER, got {text!r}")
    return name.strip(), speaker.strip()


def serving_options_from_args(args: argparse.Namespace,
                              environ: Mapping[str, str] = os.environ) -> ServingOptions:
    return ServingOptions(served_model_names=tuple(args.served_model_name or ()),
                          voice_aliases=tuple(parse_alias(a) for a in args.voice_alias or ()),
                          default_modalities=tuple(args.default_modalities), voices_dir=args.voices_dir, vad=args.vad,
                          ice_servers=ice_servers_from_args(args, environ), streaming_input=args.streaming_input,
                          speculative_reply_ms=args.speculative_reply_ms,
                          realtime_first_chunk_frames=args.realtime_first_chunk_frames,
                          trace_loop_stalls_ms=args.trace_loop_stalls_ms)


def ice_servers_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[IceServer, ...]:
    credential = environ.get("OMNISTAGE_WEBRTC_TURN_CREDENTIAL")  # a secret: not on the command line
    turns = tuple(IceServer(url, args.webrtc_turn_username, credential) for url in args.webrtc_turn or ())
    stuns = tuple(IceServer(url) for url in args.webrtc_stun or ())
    if any(not s.url.startswith(("stun:", "stuns:")) for s in stuns) or any(
            not t.url.startswith(("turn:", "turns:")) for t in turns):
        raise ValueError("--webrtc-stun takes stun:/stuns: URLs, --webrtc-turn turn:/turns: URLs")
    return stuns + turns


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
    media.add_argument("--remote-media-timeout", type=float, default=10.0,
                       help="seconds one remote fetch may take in all: connecting, every redirect and the body "
                            "(default 10)")
    media.add_argument("--allowed-media-domains", type=_csv, default=(),
                       help="comma-separated hosts that remote media may be fetched from even when they resolve to "
                            "loopback, private or link-local addresses (those are refused otherwise)")
    serving = parser.add_argument_group("names and defaults")
    serving.add_argument("--served-model-name", nargs="+", default=None,
                         help="the model names requests may use (several allowed; the first is the main one; "
                              "default: the --model value)")
    serving.add_argument("--voice-alias", action="append", default=None, metavar="NAME=SPEAKER",
                         help="map a voice name to a checkpoint speaker, over the default OpenAI voice table "
                              "(repeatable)")
    serving.add_argument("--default-modalities", type=_csv, default=("text",),
                         help="output of a chat request that names no modalities: text (OpenAI's default) or "
                              "text,audio (vLLM-Omni's)")
    serving.add_argument("--voices-dir", type=Path, default=None,
                         help="keep voices cloned through POST /v1/audio/voices in this folder (a Qwen3-TTS Base "
                              "checkpoint; default: registration off)")
    serving.add_argument("--vad", choices=("auto", "silero", "energy"), default="auto",
                         help="realtime server_vad detector: Silero VAD's model on CPU (silero), an RMS level "
                              "(energy), or Silero with the energy detector as fallback when its model cannot load "
                              "(auto, the default)")
    serving.add_argument("--streaming-input", action=argparse.BooleanOptionalAction, default=True,
                         help="realtime sessions encode and prefill the user's turn window by window while it is "
                              "spoken (default on; a session's streaming_input overrides it)")
    serving.add_argument("--speculative-reply-ms", type=int, default=DEFAULT_SPECULATIVE_REPLY_MS, metavar="MS",
                         help="realtime, with streaming input and server VAD: after MS of silence in a turn, start "
                              "its reply on the audio so far, held until the VAD's silence_duration_ms ends the turn "
                              "and dropped if the user speaks again (default %(default)s; 0: off; a session's "
                              "speculative_reply_ms overrides it)")
    serving.add_argument("--realtime-first-chunk-frames", type=int, default=None, metavar="N",
                         help="codec frames in a realtime reply's first code2wav chunk (default: the stage config's "
                              "initial_codec_chunk_frames, grown with the codec stage's load)")
    serving.add_argument("--trace-loop-stalls-ms", type=float, default=0.0, metavar="MS",
                         help="diagnostic: when the event loop stalls longer than MS, log the stacks of the loop "
                              "thread and every other Python thread, once per stall (default 0: off)")
    webrtc = parser.add_argument_group("WebRTC calls (POST /v1/realtime/calls)")
    webrtc.add_argument("--webrtc-stun", action="append", default=None, metavar="URL",
                        help="a STUN server (stun:HOST:PORT) calls use to find their public address (repeatable; "
                             "default: none, host candidates only)")
    webrtc.add_argument("--webrtc-turn", action="append", default=None, metavar="URL",
                        help="a TURN relay (turn:HOST:PORT) for peers behind NAT (repeatable); its password is read "
                             "from $OMNISTAGE_WEBRTC_TURN_CREDENTIAL")
    webrtc.add_argument("--webrtc-turn-username", default=None, help="the TURN relay's user name")
    for f in fields(WebRtcPolicy):
        if f.name != "allowed_networks":
            kind = float if isinstance(f.default, float) else int
            webrtc.add_argument(_flag("webrtc_" + f.name), type=kind, default=f.default,
                                help=f"{f.metadata['help']} (default {f.default})")
    webrtc.add_argument("--webrtc-allowed-networks", type=_csv, default=(), metavar="CIDR,...",
                        help="comma-separated networks (10.0.0.0/8,fd00::/8) whose ICE candidates are used although "
                             "private, link-local or reserved (refused otherwise; loopback is allowed when the server "
                             "listens on loopback)")
    access = parser.add_argument_group("access (see README: Exposing the server)")
    access.add_argument("--api-key", action="append", default=None,
                        help="require 'Authorization: Bearer KEY' on every route but /health (repeatable; "
                             "default: $OMNISTAGE_API_KEY, else no key)")
    access.add_argument("--protect-metrics", action="store_true", help="/metrics needs the API key too")
    access.add_argument("--allowed-origins", type=_csv, default=(),
                        help="comma-separated Origins (scheme://host[:port]) a browser WebSocket may come from besides "
                             "the server's own; '*' for any (default: none)")
    access.add_argument("--allowed-hosts", type=_csv, default=None,
                        help="comma-separated Host names the server answers to; '*' for any (default: loopback names "
                             "when bound to loopback, against DNS rebinding; else any)")
    access.add_argument("--ssl-keyfile", default=None, help="TLS private key (PEM): serve https:// and wss://")
    access.add_argument("--ssl-certfile", default=None, help="TLS certificate chain (PEM), with --ssl-keyfile")


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def access_policy_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> AccessPolicy:
    keys = args.api_key or ([environ["OMNISTAGE_API_KEY"]] if environ.get("OMNISTAGE_API_KEY") else [])
    hosts = args.allowed_hosts
    if hosts is None and _is_loopback(args.host):
        hosts = LOOPBACK_HOSTS
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together")
    return AccessPolicy(api_keys=tuple(keys), protect_metrics=args.protect_metrics,
                        allowed_origins=tuple(args.allowed_origins),
                        allowed_hosts=None if hosts is None or "*" in hosts else frozenset(hosts))


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits)})  # one flag per field


def media_policy_from_args(args: argparse.Namespace) -> MediaPolicy:
    return MediaPolicy(allowed_local_media_path=args.allowed_local_media_path,
                       allow_remote_media=args.allow_remote_media, remote_timeout_s=args.remote_media_timeout,
                       allowed_media_domains=tuple(args.allowed_media_domains))


def webrtc_policy_from_args(args: argparse.Namespace) -> WebRtcPolicy:
    """The WebRTC flags; a server that listens on loopback may also be reached by loopback candidates (a browser
    on the same machine), and only then."""
    networks = tuple(ipaddress.ip_network(n, strict=False) for n in args.webrtc_allowed_networks)
    if _is_loopback(args.host):
        networks += LOOPBACK_NETWORKS
    bounds = {f.name: getattr(args, "webrtc_" + f.name) for f in fields(WebRtcPolicy) if f.name != "allowed_networks"}
    return WebRtcPolicy(**bounds, allowed_networks=networks)
