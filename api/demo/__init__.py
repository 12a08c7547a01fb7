"""The demo and the simulation: synthetic devices for the CLI, tests and benchmarks.

Apart from the service: nothing under ``dp_governor.api.app`` imports this package.
"""
