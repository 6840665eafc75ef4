"""Weight-only int8 on the generator, as ``serve --quantization int8`` asks: every attention and text/audio MLP
linear is quantized as loaded (the embeddings and the audio head are not), the served worker still makes frames, and
the first step's logits stay near fp32's."""

from __future__ import annotations

import torch

from omnistage.config.pipeline import PipelineSpec, StageOverrides, apply_overrides, load_preset
from omnistage.families.higgs_audio_v2.checkpoint import load_model
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.family import PRESET
from omnistage.families.higgs_audio_v2.payloads import HiggsSpeech
from omnistage.families.higgs_audio_v2.prompt import HiggsTokenizer
from omnistage.families.higgs_audio_v2.workers import GeneratorWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import CodecFrames
from omnistage.models.sequence_cache import SequenceCache
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec

# q, k, v, o and the text and audio MLPs' gate, up, down
LINEARS_PER_LAYER = 4 + 3 + 3


def _int8_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.dtype == torch.int8]


def test_served_generator_loads_int8_and_makes_frames(higgs_tiny):
    spec: PipelineSpec = apply_overrides(load_preset(PRESET), StageOverrides(quantization=(("", "int8"),)))
    worker = GeneratorWorker(WorkerSpec(str(higgs_tiny), spec.stage("generator")))
    model = worker.runner.model
    quantized = _int8_names(model)
    assert len(quantized) == LINEARS_PER_LAYER * model.cfg.num_hidden_layers
    assert not any("embed" in n or "head" in n or "norm" in n for n in quantized)
    attention = model.model.layers[0].self_attn
    assert attention.qkv.weight.dtype == torch.int8 and attention.qkv.scale is not None  # the stack is int8 too
    assert attention.q_proj.weight.data_ptr() == attention.qkv.weight.data_ptr()  # and the only copy
    prompt = HiggsTokenizer(higgs_tiny, model.cfg).prompt("hello there")
    worker.handle(StageInput("a", HiggsSpeech(prompt, SamplingParams(temperature=0.0, max_tokens=10))))
    frames = []
    while worker.has_work():
        frames += [o.payload.frames for o in worker.step().outputs if isinstance(o.payload, CodecFrames)]
    codes = torch.cat(frames)
    assert codes.shape == (10, model.cfg.num_codebooks) and int(codes.min()) >= 0


def test_int8_first_step_stays_near_fp32(higgs_tiny):
    """The prompt's logits (every codebook) within 5% of their spread of fp32's (one scale per row, 127 levels),
    the greedy pick the same; random weights amplify rounding over frames, so whole frames are not compared."""
    ckpt = HiggsCheckpoint.from_folder(higgs_tiny)
    int8, fp32 = load_model(higgs_tiny, ckpt, quantization="int8"), load_model(higgs_tiny, ckpt)
    assert _int8_names(int8) and not _int8_names(fp32)
    prompt = HiggsTokenizer(higgs_tiny, ckpt.model).prompt("hello there, how are you")
    def logits(model) -> torch.Tensor:  # noqa: ANN001
        with torch.inference_mode():
            return model.prefill(prompt.input_ids(ckpt.model), prompt.audio_frames(ckpt.model), SequenceCache())[0]

    ours, theirs = logits(int8), logits(fp32)
    assert not torch.equal(ours, theirs)
    torch.testing.assert_close(ours, theirs, atol=0.05 * float(theirs.std()), rtol=0)
    assert torch.equal(ours.argmax(dim=-1), theirs.argmax(dim=-1))
