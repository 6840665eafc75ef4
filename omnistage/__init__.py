"""omnistage: a serving system for Qwen3-Omni-style models."""

__version__ = "0.1.0"
