"""The OpenAI-compatible HTTP API (FastAPI). Import ``api_server`` for ``build_app``/``run_server``;
this package's ``__init__`` stays empty so the CLI can read ``server_config`` without FastAPI.

One package per API (``chat/``, ``speech/``, ``realtime/``), each with its own ``protocol.py`` of bodies;
``media/`` fetches and decodes what requests name; ``common/`` holds the guards and plumbing every API shares.
Imports point down: ``api_server`` → an API package → ``media/`` → ``common/`` → ``engine_protocol``,
``server_config``; one API package never imports another."""
