"""G.711: every code decodes to the standard's value and encodes back to itself; a tone survives a round trip."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.audio.g711 import ALAW_TO_PCM, ULAW_TO_PCM, decode_g711, encode_g711


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_every_code_round_trips(law: str) -> None:
    codes = bytes(range(256))
    back = encode_g711(decode_g711(codes, law), law)
    # mu-law has two zeros (0x7f and 0xff); both encode to the positive one.
    same = [a == b or (law == "ulaw" and {a, b} <= {0x7F, 0xFF}) for a, b in zip(codes, back)]
    assert all(same)


def test_table_values_are_the_standard_ones() -> None:
    assert ULAW_TO_PCM[[0x00, 0x80, 0xFF]].tolist() == [-32124, 32124, 0]
    assert ALAW_TO_PCM[[0x55, 0xD5, 0x2A, 0xAA]].tolist() == [-8, 8, -32256, 32256]


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_a_tone_keeps_over_30_db(law: str) -> None:
    t = np.arange(8000) / 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    back = decode_g711(encode_g711(tone, law), law)
    snr = 10 * np.log10(np.mean(tone**2) / np.mean((back - tone) ** 2))
    assert snr > 30
