"""Building a model's modules for a checkpoint to fill: on the right device, in the right dtype, and (``empty``)
without storage for the weights the checkpoint overwrites.

``empty=True`` sends every ``torch.empty`` made while building to the meta device. That is how linears,
embeddings, convolutions and fused experts make their weights (uninitialised storage, then an init the checkpoint
overwrites anyway), so those weights take no memory and cost no random initialisation until the loader gives them
their checkpoint values, quantized as read where asked. Everything computed while building (RoPE frequencies,
sinusoid tables: non-persistent buffers no checkpoint holds) is made from other factories and stays real; small
parameters made with ``ones``/``zeros`` (norms, biases) are real too and simply overwritten.
:func:`assert_materialized` after loading names anything still on meta.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class _EmptyOnMeta(TorchFunctionMode):
    """Within the mode (this thread only), ``torch.empty`` makes meta tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = dict(kwargs or {})
        if func is torch.empty:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


@contextmanager
def build_on(device: torch.device | str, dtype: torch.dtype, empty: bool = False) -> Iterator[None]:
    """Creates parameters directly on ``device`` in ``dtype`` (no CPU fp32 copy of a large model); with
    ``empty``, the weights made by ``torch.empty`` are left without storage for the loader to fill."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if not empty:
                yield
                return
            with _EmptyOnMeta():
                yield
    finally:
        torch.set_default_dtype(previous)


def assert_materialized(model: nn.Module) -> None:
    """Raises naming every parameter or buffer still on meta (a tensor the checkpoint did not fill, or a computed
    buffer its module built with ``torch.empty``)."""
    left = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"{len(left)} tensors were left without storage after loading: {', '.join(left[:5])}")
