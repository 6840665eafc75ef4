"""The thinker→talker transform builds exactly the talker inputs transformers builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.models.qwen3_omni.config import Qwen3OmniConfig, TalkerTokenIds
from omnistage.models.qwen3_omni.talker_prompt import TalkerProjections, TrailingText, build_talker_prompt
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor


@pytest.fixture(scope="module")
def hf_model(tiny_dir: Path):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir).eval()


def _capture_talker_inputs(model, **generate_kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seen: list[dict] = []

    def hook(module, args, kwargs):  # records the talker's prefill call
        if not seen:
            seen.append(dict(kwargs))

    handle = model.talker.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            sequences, _ = model.generate(**generate_kwargs)
    finally:
        handle.remove()
    return sequences, seen[0]["inputs_embeds"][0], seen[0]["trailing_text_hidden"][0]


@pytest.mark.parametrize("with_audio", [False, True])
def test_prompt_and_trailing_text_match_transformers(tiny_dir: Path, hf_model, with_audio: bool) -> None:
    ids = Qwen3OmniConfig.from_folder(tiny_dir).talker_ids
    proc = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    content = [{"type": "text", "text": "Tell me a story."}]
    audios = []
    if with_audio:
        content.insert(0, {"type": "audio"})
        audios = [np.random.RandomState(1).randn(8000).astype(np.float32) * 0.1]
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": content}]
    prompt = proc.process(proc.apply_chat_template(messages), audios=audios)
    input_ids = torch.tensor([prompt.token_ids])
    kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), thinker_max_new_tokens=7,
                  thinker_do_sample=False, talker_max_new_tokens=3, talker_do_sample=False, speaker="Chelsie")
    if with_audio:
        kwargs.update(input_features=prompt.mm.input_features, feature_attention_mask=prompt.mm.feature_attention_mask)
    sequences, hf_embeds, hf_trailing = _capture_talker_inputs(hf_model, **kwargs)

    generated = sequences[0, input_ids.shape[1]:].tolist()
    mm_hidden = _accept_hidden_at_mm_rows(hf_model, kwargs, prompt.token_ids, ids)
    proj = TalkerProjections(
        thinker_embed=hf_model.thinker.get_input_embeddings(), text_projection=hf_model.talker.text_projection,
        hidden_projection=hf_model.talker.hidden_projection, codec_embed=hf_model.talker.get_input_embeddings(),
    )
    with torch.no_grad():
        talker_prompt = build_talker_prompt(prompt.token_ids, mm_hidden, generated[0], ids.speaker_id("chelsie"),
                                            ids, proj)
        trailing = TrailingText(talker_prompt, proj)
        for tok in generated:  # streamed one token at a time
            trailing.extend([tok])
        assert trailing.row(len(generated) - 2) is None  # undecided until the thinker finishes
        trailing.finish()
        rows = torch.stack([trailing.row(j) for j in range(hf_trailing.shape[0])])
    torch.testing.assert_close(talker_prompt.embeds, hf_embeds, atol=1e-6, rtol=0)
    torch.testing.assert_close(rows, hf_trailing, atol=1e-6, rtol=0)
    assert torch.equal(trailing.row(hf_trailing.shape[0] + 3), talker_prompt.tts_pad_embed)


def _accept_hidden_at_mm_rows(model, kwargs: dict, prompt_ids: list[int], ids: TalkerTokenIds) -> torch.Tensor:
    layer = model.config.talker_config.accept_hidden_layer
    thinker_kwargs = {k: v for k, v in kwargs.items() if k in ("input_ids", "attention_mask", "input_features",
                                                               "feature_attention_mask")}
    with torch.no_grad():
        out = model.thinker(**thinker_kwargs, output_hidden_states=True)
    hidden = out.hidden_states[layer][0]
    rows = [i for i, t in enumerate(prompt_ids) if t in ids.multimodal]
    return hidden[rows]


def test_unknown_voice_names_known_ones(tiny_dir: Path) -> None:
    ids = Qwen3OmniConfig.from_folder(tiny_dir).talker_ids
    with pytest.raises(ValueError, match="aiden, chelsie, ethan"):
        ids.speaker_id("nobody")
