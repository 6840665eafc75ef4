"""A bad stage config is rejected at start, before any replica starts, with the offending field named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from omnistage.config.pipeline import ConfigError, parse_pipeline
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.serve_flags import add_pipeline_args, pipeline_config_from_args
from omnistage.pipeline.omni import Omni
from omnistage.families.registry import DEFAULT_REGISTRY
from omnistage.pipeline.graph import resolve_graph
from tests.pipeline.specs import preset_dict, small_dict, write_spec


QWEN3_OMNI = DEFAULT_REGISTRY.family("qwen3_omni")


def _mutated(mutate) -> dict:
    data = preset_dict()
    mutate(data)
    return data


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["stages"][1].update(model="vocoder"), "stages[1].model"),
    (lambda d: d["stages"][2].update(kind="ar"), "stages[2].kind"),
    (lambda d: d["stages"][1].update(model="thinker"), "stages[1].model"),
    (lambda d: d["edges"][0].update(transform="qwen3_omni.nope"), "edges[0].transform"),
    (lambda d: d["edges"][1].update(transform="qwen3_omni.thinker_to_talker"), "edges[1].from"),
    (lambda d: d["edges"].pop(0), "stages[1]"),
    (lambda d: d.update(stages=d["stages"][:2], edges=d["edges"][:1]), "stages[1]"),  # a talker leading nowhere
    (lambda d: d.update(stages=d["stages"][1:], edges=d["edges"][1:]), "stages[0].model"),  # no thinker to start at
])
def test_graph_errors_name_the_field(mutate, field: str) -> None:
    data = _mutated(mutate)
    with pytest.raises(ConfigError) as err:
        resolve_graph(parse_pipeline(data), QWEN3_OMNI)
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_text_only_pipeline_is_valid() -> None:
    data = _mutated(lambda d: d.update(stages=d["stages"][:1], edges=[]))
    assert not resolve_graph(parse_pipeline(data), QWEN3_OMNI).supports_audio


def test_omni_rejects_a_bad_file_before_starting(tiny_dir: Path, tmp_path: Path) -> None:
    data = small_dict()
    data["stages"][1]["replicas"] = 0
    path = write_spec(tmp_path, data)
    with pytest.raises(ConfigError, match=r"stages\[1\]\.replicas"):
        Omni(tiny_dir, path)


def test_from_args_reads_the_serve_flags(tiny_dir: Path, tmp_path: Path) -> None:
    data = small_dict()
    data["edges"][1]["transform"] = "x"
    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    args = parser.parse_args(["--stage-config", str(write_spec(tmp_path, data)), "--in-process"])
    config = pipeline_config_from_args(args, str(tiny_dir), None)
    assert config.options.in_process and config.model == str(tiny_dir)
    with pytest.raises(ConfigError, match=r"edges\[1\]\.transform"):
        AsyncOmni.from_config(config)


def test_backend_flags_become_options() -> None:
    from omnistage.pipeline.serve_flags import options_from_args
    from omnistage.pipeline.runtime import PipelineOptions

    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    default = options_from_args(parser.parse_args([]))
    assert (default.backend, default.ready_timeout_s) == ("local", PipelineOptions.ready_timeout_s)
    assert options_from_args(parser.parse_args(["--stage-ready-timeout", "3600"])).ready_timeout_s == 3600.0
    options = options_from_args(parser.parse_args(["--backend", "ray", "--ray-address", "10.0.0.1:6379"]))
    assert (options.backend, options.ray_address, options.connector_kind) == ("ray", "10.0.0.1:6379", "shm")
    for bad in (["--backend", "ray", "--in-process"], ["--ray-address", "10.0.0.1:6379"],
                ["--backend", "ray", "--connector", "inproc"], ["--backend", "ray", "--ray-address", "ray://h:10001"]):
        with pytest.raises(ValueError):
            options_from_args(parser.parse_args(bad))
    with pytest.raises(ValueError, match="backend"):
        PipelineOptions(backend="kubernetes")
    assert default.stream_interval_ms == 20.0
    assert options_from_args(parser.parse_args(["--stream-interval-ms", "0"])).stream_interval_ms == 0.0
    for bad in ("-1", "5000", "nan"):
        with pytest.raises(ValueError, match="--stream-interval-ms"):
            options_from_args(parser.parse_args(["--stream-interval-ms", bad]))


def test_embedded_random_checkpoints_get_a_talker_floor_unless_told(tiny_dir: Path, tmp_path: Path) -> None:
    """A random talker samples its end code at the first frame now and then (an empty WAV for `make serve`'s or
    `Omni("tiny")`'s first user): a pipeline asked for an embedded name makes EMBEDDED_MIN_FRAMES at least; a folder
    (the same checkpoint), or the flag, decides otherwise."""
    from omnistage.pipeline.options import EMBEDDED_MIN_FRAMES, PipelineOptions
    from omnistage.pipeline.serve_flags import options_from_args

    def floor(model: str | Path, options: PipelineOptions) -> int | None:
        omni = Omni(model, write_spec(tmp_path, small_dict()), options=options)
        try:
            return omni.pipeline.runtime.orchestrator.flows.settings.min_new_tokens
        finally:
            omni.close()

    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    unset = options_from_args(parser.parse_args(["--in-process"]))
    assert unset.talker_min_new_tokens is None and EMBEDDED_MIN_FRAMES > 0
    assert (floor("tiny", unset), floor(tiny_dir, unset)) == (EMBEDDED_MIN_FRAMES, 0)
    told = options_from_args(parser.parse_args(["--in-process", "--talker-min-new-tokens", "0"]))
    assert floor("tiny", told) == 0
    assert [PipelineOptions().for_model(e).talker_min_new_tokens for e in (True, False)] == [EMBEDDED_MIN_FRAMES, 0]
    with pytest.raises(ValueError, match="talker-min-new-tokens"):
        options_from_args(parser.parse_args(["--talker-min-new-tokens", "-1"]))
