"""Tensor transport between stages: a connector ABC, by-reference (threads) and shared-memory (processes)."""

from omnistage.pipeline.connectors.base import TensorConnector
from omnistage.pipeline.connectors.inproc import InprocConnector
from omnistage.pipeline.connectors.shm import ShmConnector, shm_available
from omnistage.pipeline.options import CONNECTORS


def make_connector(kind: str, pipeline_id: str) -> TensorConnector | None:
    """``frames`` (None): tensors travel as out-of-band zmq frames; ``shm`` falls back to it without /dev/shm."""
    if kind == "inproc":
        return InprocConnector(pipeline_id)
    if kind == "shm":
        return ShmConnector(pipeline_id) if shm_available() else None
    if kind == "frames":
        return None
    raise ValueError(f"unknown connector {kind!r} (known: {', '.join(CONNECTORS)})")


__all__ = ["CONNECTORS", "InprocConnector", "ShmConnector", "TensorConnector", "make_connector", "shm_available"]
