"""``/v1/responses``: OpenAI's Responses API on the thinker (text out, text/audio/image in, function tools)."""
