"""``omnistage verify`` on checkpoints whose margins nobody chose: the tiny's config under transformers' own random
init (:mod:`omnistage.families.qwen2_5_omni.make_plain`). Greedy codes there have top-2 gaps of ~1e-3 to 1e-2,
so a real difference of 1e-2 in the talker's logits flips some (it did: transformers' generate dropped the
talker's attention mask, and with it the codec pad/bos rows and TMRoPE), where the tiny's wide heads hid it."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnistage.families.qwen2_5_omni.make_plain import make_plain
from omnistage.families.qwen2_5_omni.verify import verify_folder, verify_spoken

# Another shape: one more layer in each decoder, twice the talker's heads (two KV heads).
OTHER_DIMS = {"thinker_config.text_config.num_hidden_layers": 3, "talker_config.num_hidden_layers": 3,
              "talker_config.num_attention_heads": 4, "talker_config.num_key_value_heads": 2}


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_plain(tmp_path_factory.mktemp("omni25-plain"), seed=13)


def test_plain_text_case_speaks_transformers_codes(plain_dir: Path) -> None:
    check = verify_spoken(plain_dir, case="text", talker_tokens=20)
    assert check.divergence() is None, check.divergence().describe()
    assert check.ok and len(check.codes[0]) == 20
    # The scores the report reads a difference's gap from are the ones greedy chose each code by.
    assert [int(s.argmax()) for s in check.code_scores] == check.codes[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ("text", "image", "video"))
def test_plain_cases_give_transformers_tokens_and_codes(case: str, plain_dir: Path) -> None:
    assert verify_folder(plain_dir, case=case).ok
    check = verify_spoken(plain_dir, case=case)
    assert check.ok, check.divergence()


@pytest.mark.slow
def test_plain_checkpoint_of_other_dims_and_seed(tmp_path: Path) -> None:
    folder = make_plain(tmp_path, seed=7, overrides=OTHER_DIMS)
    assert verify_folder(folder, case="text").ok
    check = verify_spoken(folder, case="text")
    assert check.ok, check.divergence()


def test_overrides_reach_the_config(tmp_path: Path) -> None:
    from transformers import Qwen2_5OmniConfig

    with pytest.raises(KeyError):
        make_plain(tmp_path / "bad", overrides={"talker_config.no_such_entry": 1})
    config = Qwen2_5OmniConfig.from_pretrained(make_plain(tmp_path / "ok", overrides=OTHER_DIMS))
    assert (config.talker_config.num_hidden_layers, config.talker_config.num_attention_heads) == (3, 4)
