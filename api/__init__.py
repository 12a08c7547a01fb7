"""The service and its tools: the FastAPI app, its wire contract, jobs, the CLI and the client.

``dp_governor.api.app`` builds the HTTP service from ``routes`` (one router per resource), ``deps``,
``errors`` and the report fast lane ``_lane``; every route answers with a model of ``schemas`` (the
wire contract, pure pydantic), converted from the read side by ``wire``; ``jobs`` schedules the
pipeline's and the audit log's work under ``leases`` (one holder a job, fenced); ``cli`` is the
``dpgov`` command; ``demo`` (a simulated fleet) and ``client`` stand apart from the service, and
``client`` and ``schemas`` import no server code. Modules named ``_like_this`` (the caches, the
committer, the keys, the integrity checks, the middleware...) are the service's own: no other
package imports them, and routes, commands and jobs reach the ledger's engine and policy store
only through ``_handles``. This ``__init__`` imports nothing.
"""
