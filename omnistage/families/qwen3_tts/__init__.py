"""Qwen3-TTS (12 Hz) served: talker with code predictor → codec decoder."""
