"""The demo and the simulation: synthetic devices for the CLI, tests and benchmarks.

Apart from the service: nothing under ``api.app`` imports this package.
"""
