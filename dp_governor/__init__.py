"""dp-governor: privacy accounting and budget governance for local differential privacy telemetry.

One import package; what to use for what:

- :mod:`dp_governor.client`: the typed HTTP client for devices, relays and operators.
- :mod:`dp_governor.mechanisms`: the device-side randomizers (CMS, HCMS, SFP), their sketches and
  estimates; what a device needs, with no server parts.
- :mod:`dp_governor.policies`: use-case policies (mechanism, epsilon, caps, retention, budget
  groups), Apple's table as defaults, and policy files.
- :mod:`dp_governor.budget`: the per-device ledger, its atomic check-and-charge gate, the
  accountant, the audit log and the read side (reports, what-ifs).
- :mod:`dp_governor.pipeline`: the ingestion pipeline: reports charged into the sealed inbox,
  shuffled into published batches, folded into sketches, purged past retention.
- :mod:`dp_governor.api`: the FastAPI service, its wire contract, jobs and the ``dpgov`` CLI.

In the source tree the five subpackages are the repository's top-level folders ``api/``,
``budget/``, ``mechanisms/``, ``pipeline/`` and ``policies/``; installed, they live only under
this name.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dp-governor")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
