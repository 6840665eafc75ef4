"""int8 weight-only Qwen3-TTS talker: the stage option reaches the weights, only the decoder linears become int8
(one byte each), and the codes stay close to the unquantized model's on a checkpoint with a trained model's
margins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from omnistage.config.pipeline import load_preset
from omnistage.families.qwen3_tts.family import PRESET as TTS_PRESET
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.quant.apply import apply_quantization
from omnistage.models.qwen3_tts.checkpoint import load_talker
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker
from omnistage.runner.ar_runner import default_backend
from omnistage.tools.bench.quant_tts import bench_quant_tts
from omnistage.tools.confident_tts import confident_talker_
from omnistage.workers.base import WorkerSpec

# Largest code-0 logit error of int8 weights, relative to the largest logit (1.3% measured on the tiny model).
LOGIT_TOLERANCE = 0.03


def _nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _decoder_matrices(talker: Qwen3TTSTalker) -> list[torch.Tensor]:
    stacks = (talker.model.layers, talker.code_predictor.model.layers)
    return [p for stack in stacks for p in stack.parameters() if p.dim() == 2]


def test_the_stage_option_quantizes_the_talker_and_code_predictor(tts_dirs: dict[str, Path]) -> None:
    from omnistage.families.qwen3_tts.workers import TalkerWorker

    stage = replace(load_preset(TTS_PRESET).stage("talker"), quantization="int8")
    talker = TalkerWorker(WorkerSpec(str(tts_dirs["custom_voice"]), stage)).talker
    full = load_talker(tts_dirs["custom_voice"], Qwen3TTSConfig.from_folder(tts_dirs["custom_voice"]))
    matrices = _decoder_matrices(talker)
    assert matrices and {m.dtype for m in matrices} == {torch.int8}
    elements = sum(m.numel() for m in matrices)
    assert _nbytes(full) - _nbytes(talker) == 3 * elements  # 4 bytes a weight in fp32, 1 in int8
    # Embeddings, heads, the text projection and the norms keep the stage's dtype.
    kept = [talker.codec_head.weight, talker.model.codec_embedding.weight, talker.model.norm.weight,
            *talker.code_predictor.lm_head.parameters(), *talker.text_projection.parameters()]
    assert {p.dtype for p in kept} == {torch.float32}


def _code0_logits(talker: Qwen3TTSTalker, rows: torch.Tensor) -> torch.Tensor:
    meta = AttentionMetadata.for_fresh_sequences([rows.shape[0]], "cpu")
    with torch.inference_mode(), forward_context(ForwardContext(meta, default_backend(torch.device("cpu")), None)):
        return talker.compute_logits(talker(None, torch.arange(rows.shape[0]), inputs_embeds=rows))


def test_int8_logits_stay_close(tts_dirs: dict[str, Path]) -> None:
    folder = tts_dirs["custom_voice"]
    talker = load_talker(folder, Qwen3TTSConfig.from_folder(folder))
    confident_talker_(talker)
    rows = torch.randn(20, talker.config.stack.hidden_size, generator=torch.Generator().manual_seed(0))
    full = _code0_logits(talker, rows)
    apply_quantization(talker, "int8")
    error = (_code0_logits(talker, rows) - full).abs().max()
    assert 0 < error <= LOGIT_TOLERANCE * full.abs().max()


@pytest.mark.parametrize("quantization", ["int8", "w8a8"])
def test_bench_quant_reports_code_agreement(tts_dirs: dict[str, Path], quantization: str) -> None:
    """Agreement is measured, not assumed: on confident heads nearly every code survives int8 (and W8A8, whose
    teacher-forced passes run many rows: the int8 product); the report's margins are the unquantized model's."""
    report = bench_quant_tts(str(tts_dirs["custom_voice"]), quantization, prompt_len=24, frames=8, prompts=2,
                             repeats=1, device="cpu", dtype=torch.float32)
    assert report.confident and report.frames == 2 * 9
    assert report.code0_agreement >= 0.9 and report.residual_agreement >= 0.9
    assert 0 <= report.frames_identical <= min(report.code0_agreement, report.residual_agreement)
    assert report.code0_margin_median > 0 and report.residual_margin_median > 0


def test_w8a8_marks_the_int8_linears(tts_dirs: dict[str, Path]) -> None:
    folder = tts_dirs["custom_voice"]
    talker = load_talker(folder, Qwen3TTSConfig.from_folder(folder), quantization="w8a8")
    assert {m.dtype for m in _decoder_matrices(talker)} == {torch.int8}
    layer = talker.code_predictor.model.layers[0]
    assert layer.mlp.gate_up.stacked().dynamic_inputs and layer.self_attn.qkv.stacked().dynamic_inputs
    with pytest.raises(ValueError, match="fp4"):
        load_talker(folder, Qwen3TTSConfig.from_folder(folder), quantization="fp4")
