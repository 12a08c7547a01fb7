"""The typed HTTP client: ``from dp_governor.client import Client``.

The implementation lives in :mod:`dp_governor.api.client`; this is its public address.
"""

from dp_governor.api.client import *  # noqa: F403
from dp_governor.api.client import __all__ as __all__
