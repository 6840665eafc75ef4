"""Incremental detokenisation equals a whole decode, and stop strings never reach the caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnistage.pipeline.detokenizer import IncrementalDetokenizer
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor

TEXT = "Hello there, général Kenobi! 你好 — stop here please."


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):
    return Qwen3OmniPromptProcessor.from_folder(tiny_dir).tokenizer


def _stream(detok: IncrementalDetokenizer, ids: list[int], step: int) -> tuple[str, bool]:
    out, stopped = "", False
    for i in range(0, len(ids), step):
        delta = detok.add(ids[i:i + step], final=i + step >= len(ids))
        out += delta.text
        if delta.stopped:
            return out, True
    return out, stopped


@pytest.mark.parametrize("step", [1, 2, 5])
def test_deltas_join_to_the_whole_decode(tokenizer, step: int) -> None:
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    text, stopped = _stream(IncrementalDetokenizer(tokenizer), ids, step)
    assert text == tokenizer.decode(ids, skip_special_tokens=True) and not stopped


@pytest.mark.parametrize("step", [1, 3])
def test_stop_string_cuts_the_text(tokenizer, step: int) -> None:
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    text, stopped = _stream(IncrementalDetokenizer(tokenizer, stop=("stop here", "never")), ids, step)
    assert stopped and text == TEXT[:TEXT.index("stop here")]


def test_without_tokenizer_only_tokens_flow() -> None:
    delta = IncrementalDetokenizer(None, stop=("x",)).add([1, 2, 3], final=True)
    assert delta.text == "" and not delta.stopped
