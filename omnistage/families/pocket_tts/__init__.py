"""Kyutai's Pocket TTS: a 6-layer backbone, a flow head sampling 32-d latents, a Mimi-style VAE decoder."""
