"""Pocket TTS's stages for ``omnistage plan`` (the family's ``footprints`` hook), counted off the stored files'
headers (no weight is read).

* ``backbone``: every tensor of ``model.safetensors`` (backbone, flow and EOS heads), kept in the stage's dtype
  (the family has no int8 path); its KV per token is keys and values of every layer (as many KV heads as query
  heads). Activation peak: one prompt's prefill of :data:`PREFILL_TOKENS` through the widest layer, and a
  step's rows for every running utterance.
* ``decoder``: the codec's decoding half (``latent_proj``, ``decoder.*``; its encoder is loaded by the server
  only to clone voices). Activation peak: every running stream's chunk at the widest SEANet block (the last:
  ``num_filters`` channels at the output rate), input and output of the block.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint
from omnistage.tools.plan.footprint import ParamCounts, StageFootprint, stored_params

PREFILL_TOKENS = 512  # a long sentence after a long voice prompt
MAX_NUM_SEQS = 32  # the preset's, both stages
CHUNK_FRAMES = 25  # the preset's codec_chunk_frames


def footprints(folder: str | Path, dtype_bytes: int, kv_dtype_bytes: int | None = None) -> dict[str, StageFootprint]:
    folder = Path(folder)
    ckpt = PocketCheckpoint.from_folder(folder)
    model, codec = ckpt.model, ckpt.codec
    kv = 2 * model.num_hidden_layers * model.hidden_size * (kv_dtype_bytes or dtype_bytes)
    widest = 5 * model.hidden_size + model.intermediate_size  # residual, normed, q/k/v; the MLP's inner rows
    backbone_peak = (PREFILL_TOKENS + MAX_NUM_SEQS) * widest * dtype_bytes
    decoder_peak = 2 * MAX_NUM_SEQS * CHUNK_FRAMES * codec.frame_size * codec.num_filters * dtype_bytes
    decoder = stored_params(folder / CODEC_FOLDER / "model.safetensors", ("latent_proj.", "decoder."))
    return {
        "backbone": StageFootprint("backbone", _whole(stored_params(folder / "model.safetensors")), kv, backbone_peak),
        "decoder": StageFootprint("decoder", _whole(decoder), 0, decoder_peak),
    }


def _whole(count: int) -> ParamCounts:
    return ParamCounts(quantizable=0, quantizable_rows=0, replicated=0, rest=count)
