"""OpenAI's GPT-Live API (``/v1/live/sessions``): the protocol, and the session backends it runs on."""
