"""Fake `cml` package for tests (only `cml.workers_v1`); put tests/support/fakes on sys.path to use it."""
