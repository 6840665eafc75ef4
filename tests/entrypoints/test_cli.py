"""The ``omnistage`` command as a vLLM user meets it: flags, usage, and the newcomer's mistakes as one clear line."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnistage import __version__
from omnistage.config.pipeline import apply_overrides, load_preset
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.entrypoints.cli import _commands, build_parser, main
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.families.registry import BUILTIN, DEFAULT_REGISTRY
from omnistage.usage_error import UsageError

REPO = Path(__file__).resolve().parents[2]


def _serve_config(*flags: str) -> ServeConfig:
    return ServeConfig.from_args(build_parser().parse_args(["serve", *flags]), environ={})


def test_every_flag_of_every_command_says_what_it_does() -> None:
    missing = [f"{command.prog} {action.option_strings or action.dest}" for command in _commands(build_parser())
               for action in command._actions if not action.help and not isinstance(action, argparse._HelpAction)]
    assert missing == []


def test_abbreviations_are_errors_with_the_subcommand_usage(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--prot", "18631"])  # once silently --protect-metrics
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "usage: omnistage serve" in err and "unrecognized arguments: --prot" in err
    with pytest.raises(SystemExit):
        main(["bench", "serve", "--concurrenc", "1"])
    assert "usage: omnistage bench serve" in capsys.readouterr().err


def test_version_and_log_level(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"omnistage {__version__}"
    for command in ("serve", "verify", "plan", "make-tiny"):
        assert build_parser().parse_args([command, "--model", "x", "--devices", "cpu:1GiB", "--log-level", "debug"]
                                         if command == "plan" else [command, "--log-level", "debug"]).log_level == "debug"


def test_the_model_is_positional_as_in_vllm_serve() -> None:
    assert _serve_config("tts-tiny").model == "tts-tiny"
    assert _serve_config("--model", "medium").model == "medium"
    assert _serve_config().model == "tiny"
    assert _serve_config("medium", "--model", "medium").served_name == "medium"
    with pytest.raises(UsageError, match="two models"):
        _serve_config("tiny", "--model", "medium")
    assert _serve_config("tiny", "--served-model-name", "omni", "alias").served_name == "omni"


def test_model_help_lists_every_embedded_name_and_the_registry_data_matches_the_families() -> None:
    serve = next(c for c in _commands(build_parser()) if c.prog == "omnistage serve")
    help_text = next(a.help for a in serve._actions if "--model" in a.option_strings)
    for name in DEFAULT_REGISTRY.embedded_names():
        assert name in help_text
    for name, entry in BUILTIN.items():  # the names kept as data are the families' own
        assert entry.embedded == DEFAULT_REGISTRY.family(name).hooks.tiny_names


def test_max_model_len_and_max_num_seqs_reach_the_stages() -> None:
    overrides = _serve_config("--max-model-len", "2048", "--max-num-seqs", "thinker=4,code2wav=2").pipeline.overrides
    spec = apply_overrides(load_preset(OMNI_PRESET), overrides)
    engines = {s.name: s.engine for s in spec.stages}
    assert engines["thinker"].max_model_len == engines["talker"].max_model_len == 2048
    assert engines["code2wav"].max_model_len == load_preset(OMNI_PRESET).stage("code2wav").engine.max_model_len
    assert (engines["thinker"].max_num_seqs, engines["code2wav"].max_num_seqs) == (4, 2)
    assert engines["talker"].max_num_seqs == load_preset(OMNI_PRESET).stage("talker").engine.max_num_seqs


def test_bench_serve_takes_serves_flag_name() -> None:
    args = build_parser().parse_args(["bench", "serve", "--url", "http://h:1", "--served-model-name", "omni"])
    assert args.served_model == "omni"


def _one_line_error(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    """Runs the real command; the mistake must end in exactly one line, exit code 2, no traceback."""
    run = subprocess.run([sys.executable, "-m", "omnistage.entrypoints.cli", *argv], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omnistage: error: "), run.stderr
    return lines[0]


def test_a_missing_model_path_or_a_folder_without_config_is_one_line(tmp_path: Path) -> None:
    for command in (["serve"], ["verify", "--model"], ["bench", "engine", "--model"], ["plan", "--devices",
                                                                                         "cpu:1GiB", "--model"]):
        assert "does not exist" in _one_line_error([*command, str(tmp_path / "missing")])
    assert "has no config.json" in _one_line_error(["serve", str(tmp_path)])
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert "'llama' is no known family's" in _one_line_error(["serve", str(tmp_path)])


def test_an_unwritable_cache_names_omnistage_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a cache below a file cannot be made, even as root
    line = _one_line_error(["serve", "medium"], env={"OMNISTAGE_CACHE": str(blocker / "cache")})
    assert "OMNISTAGE_CACHE" in line and str(blocker / "cache") in line


def test_a_port_in_use_is_refused_before_anything_loads(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cache = tmp_path / "cache"
    try:
        line = _one_line_error(["serve", "tiny", "--port", str(taken.getsockname()[1])],
                               env={"OMNISTAGE_CACHE": str(cache)})
    finally:
        taken.close()
    assert "already in use" in line
    assert not cache.exists()  # refused before the embedded model was even made


def test_a_bad_stage_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("stages: [\n")
    assert "not valid YAML" in _one_line_error(["serve", "--stage-config", str(tmp_path / "broken.yaml")])
    preset = yaml.safe_load(OMNI_PRESET.read_text())
    preset["stages"][0]["replicas"] = 0
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(preset))
    assert "stages[0].replicas" in _one_line_error(["serve", "--stage-config", str(tmp_path / "zero.yaml")])


def test_debug_shows_the_traceback_of_a_known_mistake(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", str(tmp_path / "missing"),
                          "--log-level", "debug"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 2 and "Traceback" in run.stderr and "omnistage: error:" in run.stderr
