"""The published layout at its real size: every tensor transformers' ``HiggsAudioV2ForConditionalGeneration`` holds
is one omnistage's generator reads, with its shape (built on the meta device: no weights), and a tiny checkpoint
written by make-tiny loads with nothing left over."""

from __future__ import annotations

import torch

from omnistage.families.higgs_audio_v2.backbone import HiggsAudioV2
from omnistage.families.higgs_audio_v2.checkpoint import load_codec, load_model
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint, HiggsConfig


def test_full_size_names_and_shapes_are_transformers():
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    reference_config = HiggsAudioV2Config(codebook_size=1026)  # the published generator's defaults
    with torch.device("meta"):
        reference = HiggsAudioV2ForConditionalGeneration(reference_config)
        ours = HiggsAudioV2(HiggsConfig.from_raw(reference_config.to_dict()))
    theirs = {n: tuple(t.shape) for n, t in reference.state_dict().items()}
    mine = {n: tuple(t.shape) for n, t in ours.state_dict().items()}
    assert mine == theirs
    assert sum(t.numel() for t in ours.parameters()) > 5e9  # Llama-3.2-3B with a second MLP in every layer


def test_a_made_checkpoint_loads_whole(higgs_tiny):
    ckpt = HiggsCheckpoint.from_folder(higgs_tiny)
    model, codec = load_model(higgs_tiny, ckpt), load_codec(higgs_tiny, encoder=True)
    assert ckpt.codec.num_quantizers == ckpt.model.num_codebooks == 8 and ckpt.codec.hop_length == 960
    assert model.model.inv_freq.shape == (ckpt.model.head_dim // 2,) and codec.samples_per_frame == 960
