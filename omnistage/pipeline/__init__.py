"""The multi-stage pipeline: stage replicas (processes or threads), connectors, the orchestrator, the Python APIs.

Read in this order: ``topology`` (what the stage config means), ``stage`` /
``workers`` (a replica's engine), ``replica`` / ``launcher`` (its loop, process
and I/O threads), ``flow`` / ``orchestrator`` (routing, streaming, aborts),
``runtime`` (assembly and teardown), ``engine`` / ``async_omni`` / ``omni``.
"""
