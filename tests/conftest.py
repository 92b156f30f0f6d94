"""Shared fixtures: the real measured profiles shipped with the package. DeepSpeed's CPU op of every test and
of every process a test starts is built in the venv's own folder (the Makefile's EXT_DIR), never in the
~/.cache folder other checkouts rebuild and lock."""

from __future__ import annotations

import os
import sys

import pytest

from envpipe.profile import Profile, embedded_profile_path, load_profile

if sys.prefix != sys.base_prefix:  # in a venv (else where the op goes is the user's to say)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


@pytest.fixture(scope="session")
def gpt3() -> Profile:
    return load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))


@pytest.fixture(scope="session")
def bloom() -> Profile:
    return load_profile(embedded_profile_path("bloom+a40_bf16"))
