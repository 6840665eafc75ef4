"""Import-only stand-in for `sox` in the Qwen3-TTS reference subprocess (see ../README.md): using it raises."""


def __getattr__(name: str) -> object:
    raise ImportError(f"sox.{name}: only the 25 Hz tokenizer uses sox, which omnistage's reference run never builds")
