"""pytest plugin of zsched (entry point ``pytest11: zsched``): the fixture ``zsched_stack``.

Opt-in: a test that names the fixture gets a fresh :class:`~scheduler.testing.TestStack` (an
in-memory Redis with a fake clock, its own namespace), closed after the test; nothing else changes
for tests that do not. Options come from the ``zsched`` marker::

    @pytest.mark.zsched(partitions=4, now=datetime(2025, 3, 9, 6, 0, tzinfo=UTC), seed=7)
    def test_digest(zsched_stack): ...

``ZSCHED_TEST_REDIS_URL`` in the environment runs every ``zsched_stack`` on that real Redis
instead (time travel then raises :class:`~scheduler.testing.TimeTravelUnavailable`); a marker's
``redis_url=`` does it for one test. Loading the plugin imports nothing of zsched's client or
fakeredis: that happens when a test asks for the fixture.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .stack import TestStack

ENV_URL = "ZSCHED_TEST_REDIS_URL"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "zsched(**options): options of the zsched_stack fixture (partitions=, now=, seed=, "
        "tombstone_ttl=, namespace=, redis_url=); see scheduler.testing.TestStack")


@pytest.fixture
def zsched_stack(request: pytest.FixtureRequest) -> Iterator[TestStack]:
    """A fresh zsched :class:`~scheduler.testing.TestStack` for this test (in-memory Redis, fake
    clock, a namespace of its own), configured by ``@pytest.mark.zsched(...)``."""
    from .stack import TestStack

    marker = request.node.get_closest_marker("zsched")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise pytest.UsageError(f"@pytest.mark.zsched takes keyword options only, got {marker.args!r}")
    if "redis_url" not in options and os.environ.get(ENV_URL):
        options["redis_url"] = os.environ[ENV_URL]
    with TestStack(**options) as stack:
        yield stack
