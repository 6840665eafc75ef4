"""``omnistage make-tiny --model-type qwen2_5_omni``: a random tiny Qwen2.5-Omni checkpoint, written offline.

The folder is what transformers' ``Qwen2_5OmniForConditionalGeneration.from_pretrained`` loads and runs
``generate(..., return_audio=True)`` on: config.json (:mod:`tiny_config`), model.safetensors, the shared offline
tokenizer and chat template, processor configs and ``spk_dict.pt`` (Chelsie and Ethan: each speaker's talker
text-bos id, DiT conditioning vector and reference mel). Weights come from transformers' initialisers under a fixed
seed and are saved sorted, so a seed gives byte-identical weights.

Drawn so that parity tests test something: the thinker's head is made confident (trained-model greedy margins,
:mod:`omnistage.tiny.confident_head`), the talker's codec head is wide with zero rows for the codec EOS ids (a
random talker speaks until ``max_new_tokens`` instead of stopping at once), and the vocoder's convolutions are
fan-in scaled so the waveform is of order 0.01-0.1 rather than ~1e-8.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnistage.families.qwen2_5_omni.tiny_config import CODEC, SPEAKERS, speaker_bos_ids, tiny_config_dict
from omnistage.tiny.audible_vocoder import audible_vocoder
from omnistage.tiny.cache import cached_build
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.tiny.confident_head import EMBED_KEY, HEAD_KEY, confident_head_
from omnistage.tiny.tokenizer import ROLE_WORDS, TokenizerLayout, save_tokenizer

BPE_SIZE = 960
TINY_VERSION = 1  # bump when a made checkpoint's content changes, so caches are rebuilt
TALKER_HEAD_STD = 0.5  # codec-head logit gaps far above float noise
REF_MEL_FRAMES = 48
THINKER_EMBED = "thinker.model.language_model.embed_tokens.weight"
THINKER_HEAD = "thinker.lm_head.weight"


def make_tiny(out_dir: str | Path, seed: int = 0) -> Path:
    """Writes the tiny checkpoint into ``out_dir`` (created; existing files replaced)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)
    vocab = json.loads((out / "vocab.json").read_text())
    config = tiny_config_dict(layout, {word: vocab[word] for word in ROLE_WORDS})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    _save_weights(out, seed, layout)
    torch.save(_speakers(layout, config, seed), out / "spk_dict.pt")
    _save_processor(out)
    generation = {"eos_token_id": [layout.special_id("<|im_end|>")],
                  "pad_token_id": layout.special_id("<|endoftext|>")}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out


def _save_weights(out: Path, seed: int, layout: TokenizerLayout) -> None:
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration._from_config(Qwen2_5OmniConfig.from_pretrained(out),
                                                             dtype=torch.float32).eval()
    _wide_talker_head(model.talker.codec_head.weight, seed)
    audible_vocoder(model.token2wav.code2wav_bigvgan_model)
    state = {name: t.detach().contiguous() for name, t in sorted(model.state_dict().items())}
    # The shared tool names Qwen3-Omni's tensors; Qwen2.5-Omni's runtime layout uses the same two names.
    assert (EMBED_KEY, HEAD_KEY) == (THINKER_EMBED, THINKER_HEAD)
    confident_head_(state, layout.bpe_size, seed)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def _wide_talker_head(weight: torch.Tensor, seed: int) -> None:
    """Codec logits with gaps of order 1 (greedy codes do not flip under float noise); EOS rows zero, so the
    random talker never ends on its own."""
    generator = torch.Generator().manual_seed(seed + 2)
    weight.copy_(torch.randn(weight.shape, generator=generator) * TALKER_HEAD_STD)
    weight[[CODEC["pad"], CODEC["eos"]]] = 0.0


def _speakers(layout: TokenizerLayout, config: dict, seed: int) -> dict[str, dict[str, object]]:
    """``spk_dict.pt`` as the released checkpoint lays it out: per speaker its talker text-bos id, the DiT's
    speaker vector ``cond [1, enc_emb_dim]`` and reference mel ``ref_mel [1, frames, mel_dim]``."""
    dit = config["token2wav_config"]["dit_config"]
    generator = torch.Generator().manual_seed(seed + 3)
    bos = speaker_bos_ids(layout)
    return {name: {"bos_token": bos[name],
                   "cond": torch.randn(1, dit["enc_emb_dim"], generator=generator),
                   "ref_mel": torch.randn(1, REF_MEL_FRAMES, dit["mel_dim"], generator=generator)}
            for name in SPEAKERS}


def _save_processor(out: Path) -> None:
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300,
                                       n_fft=400, padding_value=0.0, return_attention_mask=True)
    # Small pixel bounds keep tiny-model image prompts short on a CPU.
    bounds = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 64}
    images = Qwen2VLImageProcessorPil(patch_size=14, temporal_patch_size=2, merge_size=2, size=bounds)
    features.save_pretrained(out)
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    preprocessor.update(images.to_dict())
    preprocessor["processor_class"] = "Qwen2_5OmniProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True))
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 14, "temporal_patch_size": 2,
             "merge_size": 2, "size": bounds, "do_sample_frames": False, "processor_class": "Qwen2_5OmniProcessor"}
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2, sort_keys=True))


def tiny_dir(seed: int = 0) -> Path:
    """The embedded tiny checkpoint under ``$OMNISTAGE_CACHE``, made on first use."""
    return cached_build(f"omni25-tiny-v{TINY_VERSION}-seed{seed}", lambda out: make_tiny(out, seed=seed))


def cached_checkpoint(name: str) -> Path:
    """The family's ``cached`` hook: ``--model omni25-tiny``."""
    if name != "omni25-tiny":
        raise ValueError(f"no embedded Qwen2.5-Omni checkpoint {name!r} (known: omni25-tiny)")
    return tiny_dir()
