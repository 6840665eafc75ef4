"""What ``omnistage verify`` can check, as plain data: the CLI lists it without importing torch or a model."""

TOLERANCE = 1e-4  # bound on prompt logits and waveform differences (fp32, CPU)
CASE_NAMES = ("text", "text+audio", "text+image", "text+video")  # Qwen3-Omni prompts
TTS_CASE_NAMES = ("custom-voice", "custom-voice+instructions", "voice-design", "voice-clone", "voice-clone-xvector")
# The greedy run's lengths (``GenerationSettings``' defaults; a test keeps the two equal).
MAX_NEW_TOKENS = 12
TALKER_MAX_NEW_TOKENS = 24
