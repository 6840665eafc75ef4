"""``PackedLinear``: a wide CPU float32 linear run by oneDNN on a weight reordered once.

torch's CPU linear is MKL's sgemm, and on this project's AMD (Zen 4) hosts MKL runs its generic kernels
(``mkl_blas_def_*``), not its AVX-512 ones. oneDNN JIT-builds AVX-512 code for the host; on a weight reordered into
its blocked layout once, an ``[8, 64] x [64, 8208]`` product (Higgs Audio v2 tiny's audio head, a batch-8 step)
takes 55 us against MKL's 117, and the full model's ``[8, 3072] x [3072, 8208]`` 4.0 ms against 10.7 (one thread).
For narrow weights (a few hundred outputs) oneDNN's fixed cost per call (~10 us) loses to MKL: use it for wide
ones only. The result is the same product summed in another order: equal to ``F.linear`` within float32 rounding
(bit-equal at K = 64 here, ~1e-4 at K = 3072).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PackedLinear:
    """``x @ weight.T`` (no bias) for ``x [..., K]``: oneDNN on a packed copy where it can run (CPU, float32,
    oneDNN built in), else ``F.linear`` on the weight as it is. The packed copy is made at construction: a weight
    changed or moved later is not seen (build it once the model is loaded, as ``StackedLinear`` stacks are)."""

    def __init__(self, weight: torch.Tensor, batch_hint: int = 8) -> None:
        self.weight = weight
        self.packed: torch.Tensor | None = None
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            with torch.no_grad():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, None, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])
