"""OpenTelemetry traces of requests (``serve --otlp-traces-endpoint``): the flags (``options.py``, no SDK needed),
the exporter (``otel.py``) and the pipeline's spans made from a finished request's trace (``pipeline_spans.py``).
Only ``options.py`` is imported when tracing is off; the others need the ``otel`` extra."""
