"""``POST /v1/audio/speech``, its ``WS /v1/audio/speech/stream`` and ``/v1/audio/voices``: text in, speech out."""
