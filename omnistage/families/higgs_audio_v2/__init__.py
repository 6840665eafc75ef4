"""Higgs Audio v2 (Boson AI): a Llama-3.2-3B-shaped DualFFN backbone over 8 delayed codebooks, and its 25 Hz codec."""
