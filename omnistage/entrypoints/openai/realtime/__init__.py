"""``WS /v1/realtime``: OpenAI Realtime voice sessions (GA events, and the beta protocol) over one WebSocket."""
