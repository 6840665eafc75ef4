"""The sizes ``omnistage make-tiny --size`` writes: one frozen spec per size, every width in one place.

* ``tiny``: toy widths (hidden 32, 4 code groups); Python overhead is all the work. The default.
* ``medium``: the real codec layout (16 code groups, codebook 2048, talker vocab 3072, so the real codec and speaker
  ids) and stacks wide enough that compute dominates on a CPU (thinker hidden 512, 6 layers, 32 experts top-4;
  code2wav hidden 256 with a 128-channel decoder, ~0.05 s of one core per second of audio). The talker and its 5-layer code predictor are 128 wide: their 15 sequential passes per
  frame read the 15 codebook heads (2048 rows each) and the layers 15 times, ~230 MB per frame at width 256 on
  a single core's ~10 GB/s, which no longer fits one stream into real time; at 128 several streams do, as the
  real widths do on a GPU.
* ``slice``: Qwen3-Omni-30B-A3B's real widths (thinker hidden 2048, 128 experts top-8, moe_intermediate 768,
  32/4 heads of 128; the real talker, code predictor and code2wav) with only a few decoder layers, so that
  per-layer costs at real size can be measured on a CPU. Stored in bf16 as the real checkpoint is (~3.5 GB).

Every size keeps the real upsampling (1920 samples per frame, 24 kHz) and the same offline tokenizer: the
vocabulary is the tokenizer's, not the real 152064 (a random model would emit ids no tokenizer can decode).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderWidths:
    """A Qwen3 decoder stack. ``experts == 0``: dense MLP of ``intermediate``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_expert: int = 0
    norm_topk_prob: bool = True


@dataclass(frozen=True)
class EncoderWidths:
    """The audio encoder (``heads`` over ``hidden`` = d_model) or the vision encoder."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    downsample_hidden: int = 0  # audio only: the conv front end's channels


@dataclass(frozen=True)
class VocoderWidths:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    decoder_dim: int


@dataclass(frozen=True)
class CheckpointSize:
    name: str
    thinker: DecoderWidths
    talker: DecoderWidths
    code_predictor: DecoderWidths
    audio: EncoderWidths
    vision: EncoderWidths
    code2wav: VocoderWidths
    codebook_size: int
    num_code_groups: int
    accept_hidden_layer: int  # index into the thinker's hidden states; 0 = embeddings
    mrope_section: tuple[int, int, int]  # sums to head_dim / 2 of the thinker and talker
    dtype: str = "float32"  # what model.safetensors stores

    def __post_init__(self) -> None:
        for stack in (self.thinker, self.talker):
            if sum(self.mrope_section) * 2 != stack.head_dim:
                raise ValueError(f"{self.name}: mrope_section {self.mrope_section} must sum to head_dim/2")
        if self.code_predictor.hidden != self.talker.hidden:
            raise ValueError(f"{self.name}: the code predictor's hidden size must equal the talker's")
        if not 0 < self.accept_hidden_layer <= self.thinker.layers:
            raise ValueError(f"{self.name}: accept_hidden_layer must be in 1..thinker layers")

    @property
    def talker_vocab(self) -> int:
        """Codebook-0 codes below ``codebook_size``, codec specials and speakers in the top 1024 ids."""
        return 1024 + self.codebook_size


TINY = CheckpointSize(
    name="tiny",
    thinker=DecoderWidths(32, 2, 4, 2, 16, 64, experts=4, top_k=2, moe_intermediate=16),
    talker=DecoderWidths(32, 2, 4, 2, 16, 64, experts=4, top_k=2, moe_intermediate=16, shared_expert=32,
                         norm_topk_prob=False),
    code_predictor=DecoderWidths(32, 1, 4, 2, 8, 64),
    audio=EncoderWidths(32, 2, 2, 64, downsample_hidden=16),
    vision=EncoderWidths(32, 2, 2, 64),
    code2wav=VocoderWidths(32, 2, 4, 64, decoder_dim=32),
    codebook_size=64, num_code_groups=4, accept_hidden_layer=1, mrope_section=(4, 2, 2),
)

MEDIUM = CheckpointSize(
    name="medium",
    thinker=DecoderWidths(512, 6, 8, 2, 64, 1024, experts=32, top_k=4, moe_intermediate=128),
    talker=DecoderWidths(128, 4, 2, 1, 64, 256, experts=16, top_k=4, moe_intermediate=64, shared_expert=128),
    code_predictor=DecoderWidths(128, 5, 2, 1, 64, 256),
    audio=EncoderWidths(256, 2, 4, 1024, downsample_hidden=64),
    vision=EncoderWidths(256, 2, 4, 1024),
    code2wav=VocoderWidths(256, 2, 4, 512, decoder_dim=128),
    codebook_size=2048, num_code_groups=16, accept_hidden_layer=3, mrope_section=(16, 8, 8),
)

SLICE = CheckpointSize(
    name="slice",
    thinker=DecoderWidths(2048, 2, 32, 4, 128, 768, experts=128, top_k=8, moe_intermediate=768),
    talker=DecoderWidths(1024, 2, 16, 2, 128, 2048, experts=128, top_k=6, moe_intermediate=384, shared_expert=768),
    code_predictor=DecoderWidths(1024, 5, 16, 8, 128, 3072),
    audio=EncoderWidths(1280, 2, 20, 5120, downsample_hidden=480),
    vision=EncoderWidths(1152, 2, 16, 4304),
    code2wav=VocoderWidths(1024, 8, 16, 3072, decoder_dim=1536),
    codebook_size=2048, num_code_groups=16, accept_hidden_layer=1, mrope_section=(24, 20, 20), dtype="bfloat16",
)

SIZES = {size.name: size for size in (TINY, MEDIUM, SLICE)}
