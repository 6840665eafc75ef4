"""What each stage of a Qwen3-Omni checkpoint needs in memory, from its ``config.json`` alone.

Parameters are counted on transformers' own modules built on the ``meta`` device (shapes, no storage), so any
config counts exactly; they are then sorted by what omnistage does with them:

* ``quantizable``: the decoder linears and experts that ``--quantization int8`` or an FP8 checkpoint stores in
  1 byte (plus one 4-byte scale per output row); in the thinker these are also what tensor parallelism splits;
* ``replicated``: the rest of the thinker's decoder layers (norms, routers), held whole by every rank;
* everything else (embeddings, heads, encoders, the vocoder) stays in the stage's dtype on rank 0.

KV bytes per token: keys and values of every decoder layer (the thinker's and the talker's; the code predictor's
16-token context per frame is transient). Activation peak: one prefill chunk of ``max_num_batched_tokens`` through
the widest layer (residual and normed hidden, q/k/v, and each token's ``top_k`` expert gate/up rows) plus fp32
logits for ``max_num_seqs`` rows; for code2wav ``max_num_seqs`` chunks of ``chunk_frames`` frames at the widest
decoder block, twice (input and output of a block). Encoder activations for very long media are not counted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from math import prod
from pathlib import Path

QUANT_SCALE_BYTES = 4  # one float32 scale per output row of a quantized weight (GPUs)
CPU_QUANT_SCALE_BYTES = 2  # bf16 on a CPU, what torch's int8 matmul multiplies by (layers/quant/int8.py)
_DECODER = (r"layers\.\d+\.(self_attn\.[qkvo]_proj\.weight|mlp\.experts\.(gate_up_proj|down_proj)"
            r"|mlp\.(shared_expert\.)?(gate|up|down)_proj\.weight)$")
QUANTIZABLE = {
    "thinker": re.compile(r"^thinker\.model\.language_model\." + _DECODER),
    "talker": re.compile(r"^talker\.(code_predictor\.)?model\." + _DECODER),
    "code2wav": re.compile(r"^$"),  # the vocoder stays in full precision (audio quality)
}
THINKER_LAYERS = re.compile(r"^thinker\.model\.language_model\.layers\.")
STAGES = ("thinker", "talker", "code2wav")


@dataclass(frozen=True)
class ParamCounts:
    """One stage's parameters (counts, not bytes)."""

    quantizable: int
    quantizable_rows: int  # output rows of the quantizable weights (one scale each when quantized)
    replicated: int  # thinker decoder parameters every tensor-parallel rank holds whole
    rest: int  # on rank 0 only, always in the stage's dtype

    @property
    def total(self) -> int:
        return self.quantizable + self.replicated + self.rest


@dataclass(frozen=True)
class StageFootprint:
    name: str
    params: ParamCounts
    kv_bytes_per_token: int
    activation_peak: int

    def weight_bytes(self, dtype_bytes: int, quantized: bool, tp: int = 1, rank: int = 0,
                     device: str = "cuda") -> int:
        """Bytes of one tensor-parallel rank's weights (rank 0 holds the unsharded rest too) on a ``device`` kind
        (``cuda`` or ``cpu``: the scales' width differs)."""
        p = self.params
        scale_bytes = CPU_QUANT_SCALE_BYTES if device == "cpu" else QUANT_SCALE_BYTES
        per_weight = (p.quantizable + scale_bytes * p.quantizable_rows) if quantized \
            else p.quantizable * dtype_bytes
        rest = p.rest * dtype_bytes if rank == 0 else 0
        return -(-per_weight // tp) + p.replicated * dtype_bytes + rest


def count_params(config_path: str | Path) -> dict[str, ParamCounts]:
    """Per stage parameter counts of the checkpoint whose ``config.json`` is ``config_path`` (no weights read)."""
    import torch  # here: building the parser of ``omnistage plan`` stays free of torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    config = Qwen3OmniMoeConfig.from_dict(json.loads(Path(config_path).read_text()))
    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(config)
    sums = {stage: [0, 0, 0, 0] for stage in STAGES}
    for name, param in model.named_parameters():
        stage = name.split(".", 1)[0]
        if QUANTIZABLE[stage].search(name):
            sums[stage][0] += param.numel()
            sums[stage][1] += param.numel() // param.shape[-1]
        elif stage == "thinker" and THINKER_LAYERS.search(name):
            sums[stage][2] += param.numel()
        else:
            sums[stage][3] += param.numel()
    return {stage: ParamCounts(*values) for stage, values in sums.items()}


def stored_params(path: str | Path, prefixes: tuple[str, ...] = ("",)) -> int:
    """Parameters of a ``.safetensors`` file whose names start with one of ``prefixes``, from its header alone
    (for the families whose stages are counted off their stored files: the ``footprints`` hook)."""
    from omnistage.models.safetensors_file import SafetensorsFile

    stored = SafetensorsFile(path)
    try:
        return sum(prod(e.shape) for name, e in stored.entries.items() if name.startswith(prefixes))
    finally:
        stored.close()


def _decoder_activation(text: dict, tokens: int, seqs: int, dtype_bytes: int) -> int:
    hidden, heads, kv = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    mlp = 2 * text["num_experts_per_tok"] * text["moe_intermediate_size"] if text.get("num_experts") \
        else 2 * text["intermediate_size"]
    widest = 2 * hidden + (heads + 2 * kv) * head_dim + mlp
    return tokens * widest * dtype_bytes + seqs * text["vocab_size"] * 4


def _kv_per_token(text: dict, dtype_bytes: int) -> int:
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return 2 * text["num_hidden_layers"] * text["num_key_value_heads"] * head_dim * dtype_bytes


def _code2wav_activation(c2w: dict, chunks: int, chunk_frames: int, dtype_bytes: int) -> int:
    """Widest decoder block: channels ``decoder_dim / 2^(i+1)`` at ``prod(upsampling_ratios) * prod(rates[:i+1])``
    samples per frame."""
    pre = prod(c2w.get("upsampling_ratios", [2, 2]))
    rates, dim = c2w.get("upsample_rates", [8, 5, 4, 3]), c2w["decoder_dim"]
    widest = max([c2w["hidden_size"] * pre] + [dim // 2 ** (i + 1) * pre * prod(rates[:i + 1])
                                                for i in range(len(rates))])
    return 2 * chunks * chunk_frames * widest * dtype_bytes


@dataclass(frozen=True)
class Workload:
    """The engine sizes the activation peaks assume (the preset's unless given)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 32
    code2wav_chunks: int = 32
    code2wav_chunk_frames: int = 50  # 25 new frames + 25 of left context


def footprints(folder: str | Path, dtype_bytes: int, load: Workload = Workload(),
               kv_dtype_bytes: int | None = None) -> dict[str, StageFootprint]:
    """Every stage's footprint for a checkpoint folder (its config.json) in a dtype of ``dtype_bytes``, its KV
    cache in ``kv_dtype_bytes`` (default: the same)."""
    kv_bytes = kv_dtype_bytes or dtype_bytes
    path = Path(folder) / "config.json"
    raw = json.loads(path.read_text())
    counts = count_params(path)
    thinker_text, talker_text = raw["thinker_config"]["text_config"], raw["talker_config"]["text_config"]
    tokens, seqs = load.max_num_batched_tokens, load.max_num_seqs
    return {
        "thinker": StageFootprint("thinker", counts["thinker"], _kv_per_token(thinker_text, kv_bytes),
                                  _decoder_activation(thinker_text, tokens, seqs, dtype_bytes)),
        "talker": StageFootprint("talker", counts["talker"], _kv_per_token(talker_text, kv_bytes),
                                 _decoder_activation(talker_text, tokens, seqs, dtype_bytes)),
        "code2wav": StageFootprint("code2wav", counts["code2wav"], 0,
                                   _code2wav_activation(raw["code2wav_config"], load.code2wav_chunks,
                                                        load.code2wav_chunk_frames, dtype_bytes)),
    }
