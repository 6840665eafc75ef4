"""Kyutai's Moshi and NVIDIA's PersonaPlex: full-duplex speech models served as duplex sessions."""
