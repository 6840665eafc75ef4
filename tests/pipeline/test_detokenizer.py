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


@pytest.mark.parametrize("step", [1, 2, 5])
def test_a_last_delta_ending_mid_character_still_gives_all_its_text(tokenizer, step: int) -> None:
    """A reply cut by its token budget inside a character: the text before it, and its replacement character,
    are the caller's (a merged last delta held them all back, and lost them)."""
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    cut = next(n for n in range(len(ids), 0, -1) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    ids = ids[:cut]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    text, _ = _stream(IncrementalDetokenizer(tokenizer), ids, step)
    assert text == whole and whole.endswith("\ufffd") and len(whole) > 1


def test_without_tokenizer_only_tokens_flow() -> None:
    delta = IncrementalDetokenizer(None, stop=("x",)).add([1, 2, 3], final=True)
    assert delta.text == "" and not delta.stopped



def test_the_rust_backend_decodes_as_the_tokenizer_does(tokenizer) -> None:
    """A fast tokenizer is decoded through its backend: token by token, the same deltas as through ``decode``, on
    random ids (bytes of split characters and special tokens included)."""
    import random

    class Plain:  # the tokenizer's own decode only (no backend)
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(40)]
        fast, plain = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(Plain())
        assert fast._decode.func == tokenizer.backend_tokenizer.decode
        assert [fast.add([t]).text for t in ids] == [plain.add([t]).text for t in ids]


def test_a_window_that_slides_less_often_gives_the_same_deltas(tokenizer) -> None:
    """The window keeps its start for a while (its decode reused as the next delta's prefix): per token, the same
    deltas as a window sliding with every token (vLLM's offsets, written out here), on random ids with split
    characters and special tokens."""
    import random

    def sliding(ids: list[int]) -> list[str]:
        prefix = read = 0
        out = []
        for n in range(1, len(ids) + 1):
            before = tokenizer.decode(ids[prefix:read], skip_special_tokens=True)
            after = tokenizer.decode(ids[prefix:n], skip_special_tokens=True)
            if after.endswith("\ufffd") or len(after) <= len(before):
                out.append("")
                continue
            prefix, read = max(n - 6, read), n
            out.append(after[len(before):])
        return out

    rng = random.Random(1)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(60)]
        detok = IncrementalDetokenizer(tokenizer)
        assert [detok.add([t]).text for t in ids] == sliding(ids)
    ids = tokenizer(TEXT * 3, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add([t]).text for t in ids] == sliding(ids)
