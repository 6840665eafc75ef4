"""``/v1/audio/transcriptions`` and ``/v1/audio/translations``: the thinker as the speech recogniser."""
