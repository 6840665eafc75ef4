"""The shapes ``omnistage make-tiny --model-type qwen3_asr`` writes: ``tiny`` (seconds on a CPU), ``full``
(Qwen3-ASR-0.6B as published: encoder 18 x 896 into a 28 x 1024 Qwen3) and ``full-1.7b`` (encoder 24 x 1024 into
28 x 2048). Random weights, so the full sizes are for timing and memory, never for listening."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Encoder:
    d_model: int
    layers: int
    heads: int
    ffn: int
    downsample: int = 480
    n_window_infer: int = 800


def text(hidden: int, layers: int, intermediate: int, heads: int = 16, kv_heads: int = 8, head_dim: int = 128
         ) -> dict[str, int]:
    """A Qwen3 text config's widths (the LM of every size is a dense Qwen3)."""
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate}


@dataclass(frozen=True)
class ASRSize:
    name: str
    encoder: Encoder
    text: dict[str, int]
    vocab_size: int = 0  # 0: the tiny tokenizer's own size
    tied: bool = True  # the published models tie lm_head to the embeddings
    weight_dtype: str = "bfloat16"


# The tiny's attention window (400 frames, 4 s) is short so that a few seconds of test speech span several.
TINY = ASRSize("tiny", Encoder(32, 2, 4, 64, downsample=16, n_window_infer=400),
               text(64, 2, 128, heads=4, kv_heads=2, head_dim=16),
               tied=False, weight_dtype="float32")
FULL = ASRSize("full", Encoder(896, 18, 14, 3584), text(1024, 28, 3072), vocab_size=151936)
FULL_1_7B = ASRSize("full-1.7b", Encoder(1024, 24, 16, 4096), text(2048, 28, 6144), vocab_size=151936)
SIZES = {s.name: s for s in (TINY, FULL, FULL_1_7B)}


def config_dict(size: ASRSize, vocab: int, ids: dict[str, int], aligner_labels: int = 0) -> dict[str, object]:
    """transformers' ``qwen3_asr`` config.json (the ``-hf`` layout) of ``size``; ``aligner_labels`` > 0: the
    forced aligner (token classification over that many timestamp classes)."""
    enc = size.encoder
    raw: dict[str, object] = {
        "model_type": "qwen3_asr",
        "architectures": ["Qwen3ASRForTokenClassification" if aligner_labels else "Qwen3ASRForConditionalGeneration"],
        "audio_config": {"model_type": "qwen3_asr_encoder", "d_model": enc.d_model, "encoder_layers": enc.layers,
                         "encoder_attention_heads": enc.heads, "encoder_ffn_dim": enc.ffn, "num_mel_bins": 128,
                         "output_dim": size.text["hidden_size"], "downsample_hidden_size": enc.downsample,
                         "n_window": 50, "n_window_infer": enc.n_window_infer},
        "text_config": {"model_type": "qwen3", **size.text, "vocab_size": size.vocab_size or vocab,
                        "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                        "tie_word_embeddings": size.tied},
        "audio_token_id": ids["<|audio_pad|>"], "timestamp_token_id": ids["<timestamp>"],
        "pad_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|endoftext|>"], ids["<|im_end|>"]],
        "tie_word_embeddings": size.tied and not aligner_labels,
    }
    if aligner_labels:
        raw["num_labels"] = aligner_labels
        raw["token_classification_bias"] = False
    return raw
