"""``POST /v1/chat/completions``: messages (text, audio, images, video) in; text and speech out, whole or as SSE."""
