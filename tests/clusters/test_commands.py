"""Management commands of the clusters app."""

from io import StringIO

import jwt
import pytest
from django.core.management import CommandError, call_command

from clusters import services
from clusters.models import Cluster
from identity.internal_jwt import OPERATOR_AUDIENCE, verify_internal_jwt
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def test_mint_operator_token_prints_a_verifiable_token():
    cluster = ClusterFactory()
    out = StringIO()
    call_command("mint_operator_token", cluster.public_id, "--ttl", "3600", stdout=out)
    token = out.getvalue().strip()
    claims = verify_internal_jwt(token, OPERATOR_AUDIENCE)
    assert claims["sub"] == f"operator:{cluster.public_id}"
    assert claims["exp"] - claims["iat"] == 3600
    assert jwt.get_unverified_header(token)["alg"] == "RS256"


def test_default_ttl_is_seven_days():
    cluster = ClusterFactory()
    out = StringIO()
    call_command("mint_operator_token", cluster.public_id, stdout=out)
    claims = verify_internal_jwt(out.getvalue().strip(), OPERATOR_AUDIENCE)
    assert claims["exp"] - claims["iat"] == 604800


@pytest.mark.parametrize("ttl", ["0", "-5", str(31 * 24 * 3600)])
def test_bad_ttl_is_refused(ttl):
    cluster = ClusterFactory()
    with pytest.raises(CommandError, match="ttl"):
        call_command("mint_operator_token", cluster.public_id, "--ttl", ttl)


def test_unknown_and_deregistered_clusters_are_refused():
    with pytest.raises(CommandError, match="No cluster"):
        call_command("mint_operator_token", "clu_nope")
    cluster = ClusterFactory()
    services.cluster_deregister(cluster=cluster)
    with pytest.raises(CommandError, match="deregistered"):
        call_command("mint_operator_token", cluster.public_id)


def test_openapi_schema_is_served(client, staff_token):
    response = client.get("/api/v1/schema/", HTTP_AUTHORIZATION=f"Bearer {staff_token}")
    assert response.status_code == 200
    body = response.content.decode()
    assert "/api/v1/clusters/{public_id}/connection-test/" in body or "connection-test" in body


def test_operator_token_commands_print_code_and_detail():
    cluster = ClusterFactory()
    cases = [
        (["mint_operator_token", cluster.public_id, "--ttl", "0"], "invalid_ttl: "),
        (["mint_operator_token", "clu_nope"], "cluster_not_found: "),
        (["revoke_operator_tokens", "clu_nope"], "cluster_not_found: "),
        (["rotate_operator_tokens", "--cluster", "clu_nope"], "cluster_not_found: "),
    ]
    services.cluster_deregister(cluster=ClusterFactory(name="gone"))
    gone = Cluster.objects.get(name="gone").public_id
    cases += [
        (["mint_operator_token", gone], "cluster_deregistered: "),
        (["rotate_operator_tokens", "--cluster", gone], "cluster_deregistered: "),
    ]
    for argv, prefix in cases:
        with pytest.raises(CommandError) as refused:
            call_command(*argv)
        assert str(refused.value).startswith(prefix), (argv, str(refused.value))
        assert refused.value.returncode == 1
