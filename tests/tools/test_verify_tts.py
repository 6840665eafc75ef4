"""``omnistage verify`` on a Qwen3-TTS folder: detected from config.json, judged against the qwen-tts reference."""

from __future__ import annotations

import json

import pytest

from omnistage.entrypoints.cli import main
from omnistage.tools.verify.tts_reference_env import PYTHON_ENV, ReferenceUnavailable, reference_python


@pytest.fixture(scope="module")
def voice_design_dir(tmp_path_factory):
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    return make_tiny_tts(tmp_path_factory.mktemp("tts-vd"), seed=0, tts_model_type="voice_design")


def test_verify_passes_on_a_tiny_checkpoint(voice_design_dir, tmp_path, capsys):
    try:
        reference_python()
    except ReferenceUnavailable as exc:
        pytest.skip(f"the qwen-tts reference environment cannot be made here: {exc}")
    report = tmp_path / "report.json"
    assert main(["verify", "--model", str(voice_design_dir), "--talker-max-new-tokens", "6",
                 "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["ok"] and data["family"] == "qwen3_tts"
    assert [(c["name"], c["codes_identical"], c["frames"]) for c in data["cases"]] == [("voice-design", True, 5)]
    assert "PASS" in capsys.readouterr().out


def test_verify_fails_cleanly_without_a_reference(voice_design_dir, monkeypatch, capsys):
    monkeypatch.setenv(PYTHON_ENV, "/nonexistent/python")
    assert main(["verify", "--model", str(voice_design_dir), "--talker-max-new-tokens", "4"]) == 1
    assert "omnistage verify:" in capsys.readouterr().err


def test_omni_cases_are_refused_for_a_tts_checkpoint(voice_design_dir, capsys):
    assert main(["verify", "--model", str(voice_design_dir), "--case", "text+audio"]) == 2
    assert "voice-design" in capsys.readouterr().err
