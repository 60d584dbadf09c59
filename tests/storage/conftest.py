"""Fixtures of the storage tests."""

import pytest

from tests.storage.kube import stop_storage_apiserver


@pytest.fixture(scope="session", autouse=True)
def _storage_apiserver():
    """Stop the emulated apiserver of ``tests.storage.kube`` once the session is over."""
    yield
    stop_storage_apiserver()
