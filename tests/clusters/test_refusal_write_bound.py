"""Operator callbacks accepted and refused in turn (an old operator still running beside the new one) write a few
rows a minute, not one per callback: a clear reopens the refusal gate at most once a minute."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.operator_token import rotation as token_rotation
from clusters.operator_token.tokens import operator_token_mint
from tests.clusters.test_refused_callbacks import callback, cluster_updates, refusal_of
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def test_alternating_accepted_and_refused_callbacks_write_at_most_twice_each_a_minute(client):
    cluster = ClusterFactory()
    old = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    new = operator_token_mint(cluster_id=cluster.public_id)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(10):
            assert callback(client, old).status_code == 401
            assert callback(client, new).status_code == 200
    # The first refusal, its clear, the refusal recorded at once after that clear, and its clear; then nothing.
    assert len(cluster_updates(queries)) == 4
    assert refusal_of(cluster) == (None, None, "")
