"""``omnistage make-tiny --model-type qwen3_asr`` (and ``qwen3_forced_aligner``): a random Qwen3-ASR checkpoint.

The folder is what transformers' ``Qwen3ASRForConditionalGeneration.from_pretrained`` (or, for the aligner,
``Qwen3ASRForTokenClassification``) loads: config.json (:mod:`.sizes`), model.safetensors, the shared offline
tokenizer plus Qwen3-ASR's ``<asr_text>`` and ``<timestamp>`` markers, the feature extractor and
generation_config.json. ``layout="published"`` writes the same tensors as Qwen's own release lays them out
(:mod:`.published_layout`). Weights come from transformers' initialisers under a fixed seed.

The tiny recogniser's head is made confident (:mod:`omnistage.tiny.confident_head`: trained-model greedy margins),
so greedy parity is not decided by float noise; the full sizes keep the released tied head and plain random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnistage.families.qwen3_asr.published_layout import write_published
from omnistage.families.qwen3_asr.sizes import TINY, ASRSize, config_dict
from omnistage.tiny.cache import cached_build
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.tiny.confident_head import EMBED_KEY, HEAD_KEY, confident_head_
from omnistage.tiny.tokenizer import SPECIAL_TOKENS, save_tokenizer

BPE_SIZE = 960
TINY_VERSION = 1  # bump when a made checkpoint's content changes, so caches are rebuilt
MARKERS = ("<asr_text>", "<timestamp>")  # Qwen3-ASR's added tokens: decoded as text (the output parser reads them)
ALIGNER_LABELS = 64  # timestamp classes of the tiny aligner (the published one has 5000, 80 ms each)
EMBED = "model.language_model.embed_tokens.weight"
TINY_NAMES = ("asr-tiny", "aligner-tiny")


def make_tiny(out_dir: str | Path, seed: int = 0, size: ASRSize = TINY, *, aligner: bool = False,
              layout: str = "hf") -> Path:
    """Writes the checkpoint into ``out_dir`` (created; existing files replaced)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(out)
    raw = config_dict(size, len(ids) and max(ids.values()) + 1, ids, ALIGNER_LABELS if aligner else 0)
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
    state = _weights(out, seed, size, aligner, ids)
    _save_processor(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": raw["eos_token_id"],
                                                            "pad_token_id": raw["pad_token_id"]}, indent=2))
    if layout == "published":
        raw, state = write_published(raw, state)
        (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
    elif layout != "hf":
        raise ValueError(f"layout is hf or published, not {layout!r}")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _save_tokenizer(out: Path) -> dict[str, int]:
    """The shared tiny tokenizer with Qwen3-ASR's two markers appended; the ids of every added token."""
    from tokenizers import AddedToken, Tokenizer

    save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (*SPECIAL_TOKENS, *MARKERS)}
    config = json.loads((out / "tokenizer_config.json").read_text())
    for marker in MARKERS:
        config["added_tokens_decoder"][str(ids[marker])] = {
            "content": marker, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return ids


def _weights(out: Path, seed: int, size: ASRSize, aligner: bool, ids: dict[str, int]) -> dict[str, torch.Tensor]:
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration, Qwen3ASRForTokenClassification

    torch.manual_seed(seed)
    kind = Qwen3ASRForTokenClassification if aligner else Qwen3ASRForConditionalGeneration
    model = kind._from_config(Qwen3ASRConfig.from_pretrained(out), dtype=torch.float32).eval()
    state = {name: t.detach().contiguous() for name, t in sorted(model.state_dict().items())}
    if size.tied and not aligner:
        state.pop("lm_head.weight", None)  # the release stores the embeddings once
    elif not aligner:
        _confident(state, ids["<|endoftext|>"], seed)
    dtype = getattr(torch, size.weight_dtype)
    return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}


def _confident(state: dict[str, torch.Tensor], ordinary: int, seed: int) -> None:
    """The shared confident-head tool under this layout's names."""
    named = {EMBED_KEY: state[EMBED], HEAD_KEY: state["lm_head.weight"]}
    confident_head_(named, ordinary, seed)
    state[EMBED], state["lm_head.weight"] = named[EMBED_KEY], named[HEAD_KEY]


def _save_processor(out: Path) -> None:
    from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor

    Qwen3ASRFeatureExtractor().save_pretrained(out)


def tiny_dir(seed: int = 0, aligner: bool = False) -> Path:
    """The embedded tiny recogniser (or aligner) under ``$OMNISTAGE_CACHE``, made on first use."""
    kind = "aligner" if aligner else "asr"
    return cached_build(f"{kind}-tiny-v{TINY_VERSION}-seed{seed}", lambda out: make_tiny(out, seed, aligner=aligner))


def cached_checkpoint(name: str) -> Path:
    """The family's ``cached`` hook: ``--model asr-tiny`` or ``--model aligner-tiny``."""
    if name not in TINY_NAMES:
        raise ValueError(f"no embedded Qwen3-ASR checkpoint {name!r} (known: {', '.join(TINY_NAMES)})")
    return tiny_dir(aligner=name == "aligner-tiny")
