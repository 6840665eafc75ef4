"""Import-only stand-in for `torchaudio.compliance.kaldi` (see ../../README.md): using it raises."""


def __getattr__(name: str) -> object:
    raise ImportError(f"torchaudio.compliance.kaldi.{name}: only the 25 Hz tokenizer uses it, never built here")
