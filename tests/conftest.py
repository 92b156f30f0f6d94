"""Shared fixtures: the real measured profiles shipped with the package."""

from __future__ import annotations

import pytest

from envpipe.profile import Profile, embedded_profile_path, load_profile


@pytest.fixture(scope="session")
def gpt3() -> Profile:
    return load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))


@pytest.fixture(scope="session")
def bloom() -> Profile:
    return load_profile(embedded_profile_path("bloom+a40_bf16"))
