"""The multi-stage pipeline, family-neutral: stage replicas (processes, threads or Ray actors), connectors, the
orchestrator, the Python APIs.

Read in this order: ``graph`` (a stage config resolved through its model family), ``replica`` / ``launcher``
(a replica's loop, process and I/O threads around a ``workers.base.StageWorker``), ``flow`` / ``codec_edge`` /
``orchestrator`` (routing by the graph's edges, streaming, aborts), ``runtime`` (assembly and teardown),
``engine`` / ``async_omni`` / ``omni``.
"""
