"""Import-only stand-in for `onnxruntime` in the Qwen3-TTS reference subprocess (see ../README.md): using it raises."""


def __getattr__(name: str) -> object:
    raise ImportError(f"onnxruntime.{name}: only the 25 Hz tokenizer uses onnxruntime, which omnistage's reference run never builds")
