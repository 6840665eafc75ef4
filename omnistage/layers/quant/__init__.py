"""Quantized weights: on-the-fly weight-only int8 and pre-quantized FP8 checkpoints.

A quantized linear keeps its ``nn.Linear`` (so stacked views, loaders and byte counts see the same modules) but
its ``weight`` holds the 1-byte values ([N, K] int8 or float8_e4m3fn) and a ``weight_scale`` buffer one scale
per output row; fused experts hold ``gate_up_proj_scale [E, 2I]`` and ``down_proj_scale [E, H]`` beside their
1-byte tensors. :func:`omnistage.layers.quant.matmul.quantized_linear` runs such a weight.
"""
