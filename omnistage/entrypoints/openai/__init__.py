"""The OpenAI-compatible HTTP API (FastAPI). Import ``api_server`` for ``build_app``/``run_server``;
this package's ``__init__`` stays empty so the CLI can read ``server_config`` without FastAPI."""
