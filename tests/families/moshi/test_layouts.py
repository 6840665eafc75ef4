"""Kyutai's layout (PersonaPlex's 16-step depth decoder) read into the same module as transformers' layout."""

import torch
from safetensors.torch import load_file, save_file

from omnistage.families.moshi.checkpoint import load_moshi
from omnistage.families.moshi.config import KYUTAI, MoshiConfig
from omnistage.families.moshi.kyutai_layout import _pairs_to_halves
from omnistage.families.moshi.temporal import Rotary


def test_personaplex_layout_holds_the_transformers_weights_and_16_steps(moshi_tiny, personaplex_tiny):
    # both made from seed 0: the agent's 8 depth steps and the temporal transformer are the same draw
    hf, pp = load_moshi(moshi_tiny).state_dict(), load_moshi(personaplex_tiny).state_dict()
    assert MoshiConfig.from_folder(personaplex_tiny).layout == KYUTAI
    assert pp["depth_decoder.lm_heads.weight"].shape[0] == 16
    for name, tensor in hf.items():
        other = pp[name]
        if other.shape != tensor.shape:  # stacked per step: PersonaPlex's first 8 are Moshi's
            other = other[:tensor.shape[0]]
        torch.testing.assert_close(other, tensor, rtol=0, atol=0, msg=name)
    # the user's steps are their own (make-tiny perturbs them), so steps 8..15 are not 0..7 again
    assert not torch.equal(pp["depth_decoder.lm_heads.weight"][8:], pp["depth_decoder.lm_heads.weight"][:8])


def test_a_moshiko_checkpoint_fills_personaplex_missing_steps_as_its_loader_does(personaplex_tiny, tmp_path):
    """An 8-step Kyutai checkpoint read with dep_q 16: steps k >= 8 copied from k - 8, stacked attention
    tensors concatenated with themselves."""
    state = load_file(str(personaplex_tiny / "model.safetensors"))
    moshiko = {}
    for name, t in state.items():
        parts = name.split(".")
        index = next((int(p) for p in parts if p.isdigit() and parts[parts.index(p) - 1] in
                      ("depformer_in", "linears", "depformer_emb", "gating")), None)
        if index is not None and index >= 8 - (parts[0] == "depformer_emb"):
            continue
        if name.startswith("depformer.") and "self_attn" in name:
            t = t[:t.shape[0] // 2]
        moshiko[name] = t
    (tmp_path / "config.json").write_text((personaplex_tiny / "config.json").read_text())
    save_file(moshiko, str(tmp_path / "model.safetensors"))
    filled = load_moshi(tmp_path).state_dict()
    heads = filled["depth_decoder.lm_heads.weight"]
    torch.testing.assert_close(heads[8:], heads[:8], rtol=0, atol=0)
    q = filled["depth_decoder.layers.0.self_attn.q_proj.linear.weight"]
    torch.testing.assert_close(q[8:], q[:8], rtol=0, atol=0)
    torch.testing.assert_close(filled["depth_decoder.embed_tokens.9.weight"],
                               filled["depth_decoder.embed_tokens.1.weight"], rtol=0, atol=0)


def test_kyutai_interleaved_rotary_equals_rotate_half_on_permuted_rows():
    heads, hd, dim = 2, 8, 16
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(heads * hd, dim, generator=gen)
    x = torch.randn(3, dim, generator=gen)
    pos = torch.tensor([0, 5, 17])
    # Kyutai: channel pairs (2i, 2i+1) rotated by frequency i
    q = (x @ w.T).view(3, heads, hd // 2, 2)
    freqs = pos[:, None].float() * (1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)))
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
    kyutai = torch.stack([q[..., 0] * cos - q[..., 1] * sin, q[..., 0] * sin + q[..., 1] * cos], dim=-1)
    kyutai = kyutai.view(3, heads, hd // 2, 2).transpose(2, 3).reshape(3, heads, hd)  # to halves order
    ours = (x @ _pairs_to_halves(w, heads).T).view(3, heads, 1, hd).transpose(0, 2)  # [1, H, 3, D]
    rotated = Rotary(hd, 10000.0)(ours, pos[None])[0].transpose(0, 1)
    torch.testing.assert_close(rotated, kyutai, rtol=1e-5, atol=1e-5)
