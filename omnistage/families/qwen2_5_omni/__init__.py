"""Qwen2.5-Omni as a registered family (thinker stage on omnistage's engine; see family.py)."""
