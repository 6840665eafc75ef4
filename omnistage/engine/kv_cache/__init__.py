"""Paged KV cache bookkeeping: the block pool and per-request block tables."""

from omnistage.engine.kv_cache.block_pool import BlockPool, KVBlock
from omnistage.engine.kv_cache.manager import KVCacheManager

__all__ = ["BlockPool", "KVBlock", "KVCacheManager"]
