"""Attention behind a backend interface: the engine owns the KV cache, models only call ``attend``."""

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context, get_forward_context

__all__ = ["AttentionBackend", "AttentionMetadata", "ForwardContext", "forward_context", "get_forward_context"]
