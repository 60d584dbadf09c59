"""Minting operator tokens: RS256 internal JWTs whose subject is ``operator:<cluster_id>``."""

from __future__ import annotations

from django.conf import settings

from clusters.models import Cluster
from gshare.auth.internal_jwt import OPERATOR_AUDIENCE, sign_internal_jwt
from gshare.exceptions import ApplicationError, Conflict, NotFound

MAX_TTL = 30 * 24 * 3600


def operator_token_mint(*, cluster_id: str, ttl: int | None = None) -> str:
    """Mint a token for the operator of ``cluster_id``.

    Args:
        cluster_id: public id (``clu_...``) of a cluster that is not deregistered.
        ttl: lifetime in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800, at most 30 days).

    Returns:
        The compact JWS (audience ``gshare-internal``).

    Raises:
        NotFound: ``cluster_not_found``. Conflict: ``cluster_deregistered``.
        ApplicationError: ``invalid_ttl`` outside 1 s .. 30 days.
    """
    ttl = settings.GSHARE_OPERATOR_TOKEN_TTL if ttl is None else ttl
    if not 0 < ttl <= MAX_TTL:
        raise ApplicationError(f"--ttl must be between 1 and {MAX_TTL} seconds (30 days); got {ttl}.", code="invalid_ttl")
    cluster = Cluster.objects.filter(public_id=cluster_id).first()
    if cluster is None:
        raise NotFound(f"No cluster has the id {cluster_id!r}: list them with `GET /api/v1/clusters`.", code="cluster_not_found")
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict(f"Cluster {cluster.name} ({cluster_id}) is deregistered: register it again first.", code="cluster_deregistered")
    return sign_internal_jwt(f"operator:{cluster.public_id}", ttl, audience=OPERATOR_AUDIENCE)
