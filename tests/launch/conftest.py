"""The fake Kubernetes API server the kube backend's tests talk to (tests/support/fakes/kube_api.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fakes.kube_api import FakeKubeAPI


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    """A fresh fake API server; Kueue's LocalQueue team-a admits a job 0.2 s after it is created."""
    fake = FakeKubeAPI(queues={"team-a": 0.2}).start()
    yield fake
    fake.stop()
