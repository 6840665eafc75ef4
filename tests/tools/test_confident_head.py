"""``make-tiny --confident-head``: the rewrite itself, and a made checkpoint whose greedy steps lead by trained-model
margins while staying a checkpoint transformers loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from omnistage.tools.bench.quant import bench_quant
from omnistage.tiny.confident_head import (
    EMBED_KEY,
    EMBED_SCALE,
    HEAD_GAIN,
    HEAD_KEY,
    confident_head_,
    successor_permutation,
)
from omnistage.families.qwen3_omni.make_tiny import make_tiny


@pytest.fixture(scope="module")
def confident_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("confident"), seed=0, confident_head=True)


def test_rewrite_adds_successor_rows_and_leaves_specials() -> None:
    torch.manual_seed(0)
    vocab, hidden, ordinary = 12, 16, 9
    embed, head = torch.randn(vocab, hidden) * 0.02, torch.randn(vocab, hidden) * 0.02
    state = {EMBED_KEY: embed.clone(), HEAD_KEY: head.clone()}
    confident_head_(state, ordinary, seed=3)
    torch.testing.assert_close(state[EMBED_KEY], embed * EMBED_SCALE)
    torch.testing.assert_close(state[HEAD_KEY][ordinary:], head[ordinary:], rtol=0, atol=0)  # specials untouched
    succ = successor_permutation(ordinary, seed=3)
    added = state[HEAD_KEY][succ] - head[succ]
    # Row succ[t] gained t's unit embedding direction, scaled so a final state of norm sqrt(hidden) gets HEAD_GAIN.
    expected = embed[:ordinary] / embed[:ordinary].norm(dim=-1, keepdim=True) * HEAD_GAIN / hidden**0.5
    torch.testing.assert_close(added, expected, rtol=1e-5, atol=1e-6)


def test_tied_head_is_refused() -> None:
    shared = torch.randn(8, 4)
    with pytest.raises(ValueError, match="tied"):
        confident_head_({EMBED_KEY: shared, HEAD_KEY: shared}, 6, seed=0)


def test_made_checkpoint_differs_only_in_embedding_and_head(tiny_dir: Path, confident_dir: Path) -> None:
    plain, confident = load_file(str(tiny_dir / "model.safetensors")), load_file(str(confident_dir / "model.safetensors"))
    assert plain.keys() == confident.keys()
    changed = {name for name in plain if not torch.equal(plain[name], confident[name])}
    assert changed == {EMBED_KEY, HEAD_KEY}


def test_greedy_margins_are_large_and_int8_agrees(tiny_dir: Path, confident_dir: Path) -> None:
    """The plain tiny thinker's margins are a fraction of a logit; the confident one's are several, and int8
    weights then keep the greedy tokens (every position, teacher-forced)."""
    plain = bench_quant(str(tiny_dir), "int8", prompt_len=8, output_len=16, repeats=1, device="cpu",
                        dtype=torch.float32, prompts=2)
    confident = bench_quant(str(confident_dir), "int8", prompt_len=8, output_len=16, repeats=1, device="cpu",
                            dtype=torch.float32, prompts=2)
    assert plain.median_margin < 0.5
    assert confident.margin_p10 > 2.0
    assert confident.teacher_forced_agreement == 1.0 and confident.free_running_agreement == 1.0
