"""``omnistage serve``'s flags, read once into one frozen, typed configuration.

Every part of the server reads its settings from a :class:`ServeConfig` (or the typed part of it it needs); no
code after this module looks at the argparse namespace. Kept free of FastAPI and torch imports, so the CLI can
build and check it before anything heavy loads.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from omnistage.config.pipeline import ConfigError
from omnistage.entrypoints.openai.server_config import (
    AccessPolicy,
    MediaPolicy,
    ServerLimits,
    ServingOptions,
    WebRtcPolicy,
    access_policy_from_args,
    limits_from_args,
    media_policy_from_args,
    serving_options_from_args,
    webrtc_policy_from_args,
)
from omnistage.pipeline.serve_flags import PipelineConfig, pipeline_config_from_args
from omnistage.tracing.options import TracingOptions, tracing_options_from_args
from omnistage.usage_error import UsageError

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class ServeConfig:
    """Where to listen, what to serve, and every policy of the API in front of it."""

    model: str
    host: str
    port: int
    log_level: str
    pipeline: PipelineConfig
    limits: ServerLimits
    media: MediaPolicy
    access: AccessPolicy
    serving: ServingOptions
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    webrtc: WebRtcPolicy = field(default_factory=WebRtcPolicy)
    tracing: TracingOptions = field(default_factory=TracingOptions)  # --otlp-traces-endpoint: off by default

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port} is not a TCP port (0-65535)")
        if self.log_level not in LOG_LEVELS:
            raise UsageError(f"--log-level takes one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")

    @property
    def served_name(self) -> str:
        """The model id requests use (the first ``--served-model-name``, else the model as given)."""
        return self.pipeline.model_name or self.model

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeConfig:
        """The serve flags (``omnistage serve [MODEL] ...``) as a config; a bad value is a :class:`UsageError`."""
        model = _model(args)
        names = args.served_model_name or ()
        try:
            return cls(model=model, host=args.host, port=args.port, log_level=args.log_level,
                       pipeline=pipeline_config_from_args(args, model, names[0] if names else None),
                       limits=limits_from_args(args), media=media_policy_from_args(args),
                       access=access_policy_from_args(args, environ), serving=serving_options_from_args(args, environ),
                       ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                       webrtc=webrtc_policy_from_args(args), tracing=tracing_options_from_args(args, environ))
        except (UsageError, ConfigError):  # already say what is wrong, and where
            raise
        except ValueError as exc:
            raise UsageError(str(exc)) from exc


def _model(args: argparse.Namespace) -> str:
    """``serve MODEL`` (vLLM's form) or ``serve --model MODEL``; both given must agree."""
    positional, flag = args.model_tag, args.model
    if positional and flag and positional != flag:
        raise UsageError(f"two models given: {positional!r} and --model {flag!r}; give one")
    return positional or flag or "tiny"
