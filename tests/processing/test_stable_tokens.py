"""Text fed in pieces is tokenized as the whole text is: whatever the cuts (inside words, runs of spaces, a
full stop before newlines, a contraction's apostrophe, a combining accent, CJK, a client's control-token string),
the ids released piece by piece, joined, are the whole text's ids; and ids are released while the text grows,
not only at its end."""

from __future__ import annotations

import random

import pytest

from omnistage.processing.stable_tokens import StableTokens
from omnistage.processing.user_text import guard_for

TEXTS = [
    "Hello there, how are you today? I am fine, thank you.",
    "Spaces  between   words,\n\nnew lines.\n\n\nAnd it's 12,345 o'clock; isn't it?",
    "Cafe\u0301 na\u0308ive: combining marks join the letter before them. \u4f60\u597d\uff0c\u4e16\u754c\u3002",
    "Tabs\tand trailing spaces   ",
    "  leading spaces, (brackets) and \"quotes\"... ellipses!? <|im_end|> stays text <tts_pad>",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a transformers tokenizer
    """The offline BPE tokenizer every tiny checkpoint carries (Qwen's pre-tokenizer, NFC, byte-level BPE)."""
    from transformers import Qwen2Tokenizer

    from omnistage.families.qwen3_tts.make_tiny import BPE_SIZE
    from omnistage.tiny.tokenizer import save_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(folder, BPE_SIZE, "")
    return Qwen2Tokenizer.from_pretrained(str(folder))


def _cuts(text: str, rng: random.Random) -> list[str]:
    points = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, len(text) // 2))))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_released_piece_by_piece_are_the_whole_texts(tokenizer, text: str) -> None:  # noqa: ANN001
    whole = guard_for(tokenizer).plain_ids(text)
    rng = random.Random(len(text))
    naive_differs = False
    for _ in range(40):
        stream = StableTokens(tokenizer)
        ids: list[int] = []
        cuts = _cuts(text, rng)
        for piece in cuts:
            ids += stream.add(piece)
        ids += stream.finish()
        assert ids == whole
        naive_differs |= [i for piece in cuts for i in guard_for(tokenizer).plain_ids(piece)] != whole
    assert naive_differs  # the cuts do fall where tokenizing each piece alone goes wrong


def test_character_by_character_releases_ids_as_the_text_grows(tokenizer) -> None:  # noqa: ANN001
    text = TEXTS[0]
    stream = StableTokens(tokenizer)
    released_at = [len(stream.add(ch)) for ch in text]
    assert sum(released_at) > 0.7 * len(guard_for(tokenizer).plain_ids(text))  # most before the end
    first = next(i for i, n in enumerate(released_at) if n)
    assert first < text.index(" how")  # "Hello" is out once two more pieces have begun


@pytest.mark.parametrize("text", ["\n\nA text opening with newlines.", " A space first.", "Plain."])
def test_a_lead_in_front_merges_as_in_the_whole_run(tokenizer, text: str) -> None:  # noqa: ANN001
    """A wrapper's text in front (Qwen3-TTS: ``assistant\\n``): the stream's first piece may merge with it, and the
    lead's own ids are dropped by position, as slicing the whole run's ids drops them."""
    whole = guard_for(tokenizer).plain_ids("assistant\n" + text)[2:]
    stream = StableTokens(tokenizer, "assistant\n", 2)
    ids = [i for ch in text for i in stream.add(ch)] + stream.finish()
    assert ids == whole
