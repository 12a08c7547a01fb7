"""The service: the FastAPI app (``app``, ``routes``), the ingestion pipeline, jobs and the CLI.

``dp_governor.api.app`` builds the HTTP service from ``routes`` (one router per resource), ``deps``,
``schemas``, ``errors`` and the report fast lane ``lane``; ``ingestion`` charges, stores and
aggregates reports; ``jobs`` schedules the pipeline's and the audit log's work; ``cli`` is the
``dpgov`` command; ``demo`` (a simulated fleet) and ``client`` stand apart from the service.
"""
