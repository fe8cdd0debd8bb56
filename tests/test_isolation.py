"""The suite never touches the user's opscope cache: module-scoped fixtures (set up before any
function-scoped one) see the private cache too, so a calibration a fixture saves cannot change another
test's CPU ceilings, nor the user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def cache_seen_by_a_module_fixture() -> str | None:
    return os.environ.get("OPSCOPE_CACHE_DIR")


def test_module_fixtures_use_the_private_cache(cache_seen_by_a_module_fixture, tmp_path_factory):
    private = str(tmp_path_factory.getbasetemp() / "opscope-cache")
    assert cache_seen_by_a_module_fixture == private == os.environ["OPSCOPE_CACHE_DIR"]
    assert not Path(private).is_relative_to(Path.home() / ".cache")
