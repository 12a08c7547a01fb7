# The same commands CI runs (.ci/run), for local use.
.PHONY: install test lint bench

install:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,dev]'

test: install
	.venv/bin/pytest -n 2

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

bench: install
	.venv/bin/python -m benchmarks.mechanisms
