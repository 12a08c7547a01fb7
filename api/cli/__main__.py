"""``python -m api.cli``: the ``dpgov`` command."""

from api.cli import main

main()
