"""Qwen3-Omni served: thinker → talker → code2wav (or the thinker alone for Thinking checkpoints)."""
