"""Fake `cml` package for tests (only `cml.workers_v1`); put tests/fakes on sys.path to use it."""
