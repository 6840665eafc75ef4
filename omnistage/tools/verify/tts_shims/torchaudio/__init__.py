"""Import-only stand-in for `torchaudio` in the Qwen3-TTS reference subprocess (see ../README.md)."""

from torchaudio import compliance  # noqa: F401 - the 25 Hz tokenizer imports torchaudio.compliance.kaldi
