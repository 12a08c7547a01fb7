"""``python -m dp_governor.api.cli``: the ``dpgov`` command."""

from dp_governor.api.cli import main

main()
