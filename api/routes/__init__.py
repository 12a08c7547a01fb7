"""The HTTP routes, one ``APIRouter`` per resource, included by :func:`api.app.create_app`.

- :mod:`.reports`: a device's report and a relay's batch (the charge path).
- :mod:`.budgets`: what a device has left, and the device-wide budget.
- :mod:`.use_cases`: policies and budget groups (list, history, create, retire) and what-if.
- :mod:`.estimates`: frequency estimates and SFP's discovered words (admin).
- :mod:`.audit`: chain verification, a device's timeline, distributions, effective epsilon.
- :mod:`.transparency`: the transparency log's checkpoint, leaves, proofs, a device's record.
- :mod:`.operations`: liveness, Prometheus metrics, running or releasing a job.
- :mod:`.dashboard` and :mod:`.signin`: the HTML dashboard at ``/`` and its sign-in form.

Every route answers with a model of :mod:`dp_governor.api.schemas`; domain errors map to HTTP
once, in :mod:`dp_governor.api.errors`.
"""
