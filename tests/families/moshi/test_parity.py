"""Moshi against transformers' MoshiForConditionalGeneration, and streamed steps against one offline pass."""

import argparse

from omnistage.families.moshi.checkpoint import load_moshi
from omnistage.families.moshi.verify import case_generate, case_streaming, run_verify_command


def test_text_and_codes_equal_transformers_generate_on_the_same_user_stream(moshi_tiny):
    result = case_generate(moshi_tiny, load_moshi(moshi_tiny), new_frames=10)
    assert result.ok, result.detail


def test_frame_by_frame_streaming_equals_one_offline_pass_across_the_window(moshi_tiny):
    model = load_moshi(moshi_tiny)
    steps = 2 * model.cfg.context + 3  # the ring of the 24-frame window wraps twice
    result = case_streaming(model, steps, tolerance=1e-4)
    assert result.ok, result.detail


def test_verify_command_runs_both_cases(moshi_tiny, tmp_path, capsys):
    out = tmp_path / "report.json"
    args = argparse.Namespace(max_new_tokens=6, tolerance=None, json=str(out))
    assert run_verify_command(args, moshi_tiny) == 0
    assert '"generate"' in out.read_text() and '"streaming"' in out.read_text()
