"""``omnistage serve``: start the pipeline, serve the app with uvicorn on the socket the CLI bound, say when it
is ready.

The CLI binds the port (``entrypoints/listen_socket.py``) before this module and the pipeline load, so a port in
use is reported at once, not after the checkpoint has loaded; uvicorn then listens on that very socket.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import socket
import sys
from typing import TYPE_CHECKING

from omnistage.entrypoints.openai.allocator import return_large_blocks_to_the_system
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.connection_guard import guarded_http_protocol
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.usage_error import UsageError

if TYPE_CHECKING:
    from omnistage.tracing.otel import Tracing

CLOSE_GRACE_S = 5
# Torch threads of a duplex server's process, which steps the duplex engine itself (a pipeline's stages run in
# replica processes that set their own): one, as ``bench duplex``'s default. On a contended host a parallel
# region's barrier stalls each of the step's many small ops: tiny Moshi's step took 1.3 s with two threads against
# 40 ms with one (a loaded 2-core host).
DUPLEX_THREADS = 1


def uvicorn_options(config: ServeConfig) -> dict[str, object]:
    """The ``uvicorn.Config`` settings the serve flags choose (TLS; the idle keep-alive; the header and send
    timeouts, as the HTTP protocol class; the WebSocket message bound), beside the app, the socket and logging.

    WebSocket compression (permessage-deflate) is off: inflating a client's frames runs on the event loop (a
    realtime append of 20 s of audio took ~0.2 s of the loop's CPU there), and a deflate bomb makes the server
    do that work for a few bytes sent; base64 audio gains little from it anyway."""
    return {"ssl_keyfile": config.ssl_keyfile, "ssl_certfile": config.ssl_certfile,
            "http": guarded_http_protocol(config.limits.header_timeout, config.limits.send_timeout,
                                          config.limits.body_timeout, config.limits.body_min_rate),
            "timeout_keep_alive": config.limits.keep_alive_timeout,
            "ws_max_size": config.limits.max_ws_message_bytes, "ws_per_message_deflate": False,
            # Once the drain is over (draining_server.py), what is still open (an idle keep-alive connection,
            # a WebSocket being closed) gets this long before uvicorn cancels it.
            "timeout_graceful_shutdown": CLOSE_GRACE_S}


def ready_banner(config: ServeConfig, engine: OmniEngine, port: int) -> str:
    """What a person needs once the server answers: the model id, the URLs, one request to try."""
    host = config.host if config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    base = f"{config.scheme}://{'[' + host + ']' if ':' in host else host}:{port}"
    auth = ' -H "Authorization: Bearer $OMNISTAGE_API_KEY"' if config.access.api_keys else ""
    name = config.served_name
    if engine.front_end.duplex:  # sessions only: the playground's duplex mode, or a GPT-Live client
        ws = base.replace("http", "ws", 1)
        curl = f"open {base}/ (the playground's duplex mode), or a GPT-Live client on {ws}/v1/live/sessions"
    elif engine.front_end.processor is not None:
        body = (f'{{"model": "{name}", "messages": [{{"role": "user", "content": "Hello!"}}], '
                f'"modalities": ["text", "audio"], "audio": {{"voice": "{_first_voice(engine)}", "format": "wav"}}}}')
        curl = f"curl {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"
    else:  # a text-to-speech checkpoint answers speech only
        body = f'{{"model": "{name}", "input": "Hello!", "voice": "{_first_voice(engine)}"}}'
        curl = (f"curl {base}/v1/audio/speech -H 'Content-Type: application/json'{auth} -d '{body}' "
                "-o hello.wav")
    recogniser = config.pipeline.recogniser()
    beside = [f"  beside: {recogniser.model_name!r}, a speech recogniser: /v1/audio/transcriptions and realtime "
              "input transcription naming it"] if recogniser is not None else []
    return "\n".join([
        f"omnistage is ready: model {name!r} at {base}/v1 (OpenAI-compatible)",
        *beside,
        f"  try:    {curl}",
        f"  docs:   {base}/docs    health: {base}/health    metrics: {base}/metrics",
        "  stop:   Ctrl+C",
    ])


def _first_voice(engine: OmniEngine) -> str:
    return engine.front_end.voices[0] if engine.front_end.voices else "default"


async def _announce(server: object, config: ServeConfig, engine: OmniEngine, port: int) -> None:
    while not getattr(server, "started", False):
        await asyncio.sleep(0.05)
    print(ready_banner(config, engine, port), file=sys.stderr, flush=True)


async def _serve(config: ServeConfig, sock: socket.socket) -> int:
    import uvicorn

    from omnistage.entrypoints.openai.draining_server import DrainingServer

    tracing = open_tracing(config)  # None without --otlp-traces-endpoint
    engine = load_engine(config, tracing)
    recogniser: OmniEngine | None = None

    async def end_work() -> None:
        await asyncio.gather(*(e.shutdown() for e in (engine, recogniser) if e is not None))

    try:
        recogniser = await load_recogniser(config)
        app = build_app(engine, config.limits, config.media, config.access, config.serving, config.webrtc,
                        tracing=tracing, recogniser_engine=recogniser)
        # What is built by now (modules, tokenizer, processor, app) lives as long as the server: frozen out of the
        # cyclic GC, whose full collections walked all of it on whichever thread allocated, the event loop's too
        # (0.35 and 0.73 s stalls in the soak, the loop's stack in weakref callbacks; ~0.14 s for the imports alone).
        gc.collect()  # the start-up's garbage first: frozen, it would stay
        gc.freeze()
        calls = app.state.webrtc_calls  # a WebRTC call outlives the request that set it up: it counts as in flight
        server = DrainingServer(uvicorn.Config(app, host=config.host, port=sock.getsockname()[1],
                                               log_level=config.log_level, **uvicorn_options(config)),
                                app.state.services.draining, config.limits.shutdown_timeout,
                                in_flight=lambda: app.state.services.draining.in_flight + len(calls.live),
                                end_work=end_work, on_drain=app.state.realtime.shut_down_sessions)
        announce = asyncio.create_task(_announce(server, config, engine, sock.getsockname()[1]))
        try:
            await server.serve(sockets=[sock])
        finally:
            announce.cancel()
            await app.state.webrtc_calls.close_all()  # WebRTC calls outlive their HTTP request: hang them up first
    finally:
        await end_work()
        if tracing is not None:  # the spans still queued are made and exported before the exit
            await asyncio.to_thread(tracing.close)
    return 0


def load_engine(config: ServeConfig, tracing: Tracing | None) -> OmniEngine:
    """The served model: a duplex family (its hooks give a ``duplex`` model) on the duplex engine, every other
    family on its stage pipeline."""
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.duplex_omni import DuplexOmni, serves_duplex

    if serves_duplex(config.pipeline.model):
        import torch

        torch.set_num_threads(DUPLEX_THREADS)  # this process is the duplex engine's: its CLI sets it, as a replica's
        return DuplexOmni.from_config(config.pipeline)
    return AsyncOmni.from_config(config.pipeline, trace_sink=tracing.pipeline if tracing is not None else None)


async def load_recogniser(config: ServeConfig) -> OmniEngine | None:
    """``--transcription-model``'s pipeline, started beside the model's; a checkpoint that is no speech recogniser
    is the user's mistake."""
    from omnistage.pipeline.async_omni import AsyncOmni

    pipeline = config.pipeline.recogniser()
    if pipeline is None:
        return None
    recogniser = AsyncOmni.from_config(pipeline)
    if recogniser.front_end.transcriber is None:
        await recogniser.shutdown()
        raise UsageError(f"--transcription-model {pipeline.model}: that checkpoint is no speech recogniser "
                         "(give a Qwen3-ASR checkpoint)")
    return recogniser


def open_tracing(config: ServeConfig) -> Tracing | None:
    """The server's tracer when ``--otlp-traces-endpoint`` is set (its SDK imported only then); else None."""
    if not config.tracing.enabled:
        return None
    from omnistage.tracing.otel import Tracing

    return Tracing(config.tracing, config.served_name)


def run_server(config: ServeConfig, sock: socket.socket) -> int:
    """``omnistage serve`` on a bound socket: a mistake in the request is a :class:`UsageError`; else uvicorn's
    run."""
    if config.pipeline.options.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--backend ray needs Ray: pip install 'omnistage[ray]'")
    missing = config.tracing.missing()
    if missing is not None:
        raise UsageError(missing)
    return_large_blocks_to_the_system()  # this process only: a large request's buffers leave with it (allocator.py)
    return asyncio.run(_serve(config, sock))
