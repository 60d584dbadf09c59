"""Minting operator tokens: RS256 internal JWTs whose subject is ``operator:<cluster_id>``.

Every token carries the cluster's credential generation (claim ``gen``); ``OperatorTokenAuthentication``
refuses a token of another generation (401 ``token_revoked``). Issuing a token records its expiry on the
cluster (``Cluster.operator_token_expires_at``: the latest expiry issued for the current generation).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import jwt
from django.conf import settings
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Greatest

from clusters.models import Cluster
from gshare.auth.internal_jwt import OPERATOR_AUDIENCE, sign_internal_jwt
from gshare.exceptions import ApplicationError, Conflict, NotFound
from operator_agent.contract import OPERATOR_TOKEN_GENERATION_CLAIM, OPERATOR_TOKEN_SUBJECT_PREFIX

MAX_TTL = 30 * 24 * 3600


@dataclass(frozen=True)
class IssuedToken:
    """A freshly signed operator token.

    Attributes:
        token: the compact JWS (a secret: never logged; left out of ``repr``).
        expires_at: its ``exp`` as an aware UTC datetime.
        generation: the credential generation it carries (claim ``gen``).
    """

    token: str = field(repr=False)
    expires_at: datetime.datetime
    generation: int


def _check_ttl(ttl: int | None) -> int:
    ttl = settings.GSHARE_OPERATOR_TOKEN_TTL if ttl is None else ttl
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 < ttl <= MAX_TTL:
        raise ApplicationError(f"--ttl must be between 1 and {MAX_TTL} seconds (30 days); got {ttl}.", code="invalid_ttl")
    return ttl


def operator_token_issue(*, cluster: Cluster, ttl: int | None = None) -> IssuedToken:
    """Sign a token for ``cluster``'s operator, of the cluster's current generation. Records nothing.

    Callers record the expiry once the token is delivered (:func:`operator_token_expiry_record`), so a token
    that never reached its cluster does not count.

    Args:
        cluster: a cluster that is not deregistered (its ``credential_generation`` as loaded is used).
        ttl: lifetime in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800, at most 30 days).

    Returns:
        An :class:`IssuedToken`.

    Raises:
        ApplicationError: ``invalid_ttl`` outside 1 s .. 30 days.
        Conflict: ``cluster_deregistered``.
    """
    ttl = _check_ttl(ttl)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict(f"Cluster {cluster.name} ({cluster.public_id}) is deregistered: register it again first.", code="cluster_deregistered")
    generation = cluster.credential_generation
    token = sign_internal_jwt(
        f"{OPERATOR_TOKEN_SUBJECT_PREFIX}{cluster.public_id}", ttl, audience=OPERATOR_AUDIENCE,
        claims={OPERATOR_TOKEN_GENERATION_CLAIM: generation},
    )
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    return IssuedToken(token=token, expires_at=datetime.datetime.fromtimestamp(exp, tz=datetime.UTC), generation=generation)


def operator_token_expiry_record(*, cluster: Cluster, issued: IssuedToken, **fields) -> bool:
    """Record ``issued``'s expiry on the cluster (keeping a later one already recorded), plus ``fields``.

    One ``UPDATE``, applied only while the cluster is still at ``issued.generation`` (a token revoked
    meanwhile is not recorded).

    Args:
        cluster: the cluster the token was issued for.
        issued: the token.
        **fields: more columns to set in the same statement (e.g. ``operator_token_rotated_at``).

    Returns:
        True when the row was updated, False when the cluster's generation changed meanwhile.
    """
    expiry = Value(issued.expires_at, output_field=DateTimeField())
    updated = Cluster.objects.filter(pk=cluster.pk, credential_generation=issued.generation).update(
        # PostgreSQL's GREATEST ignores NULL: the first expiry recorded is taken as is.
        operator_token_expires_at=Greatest(F("operator_token_expires_at"), expiry), **fields
    )
    return bool(updated)


def operator_token_mint(*, cluster_id: str, ttl: int | None = None) -> str:
    """Mint a token for the operator of ``cluster_id`` and record its expiry on the cluster.

    Args:
        cluster_id: public id (``clu_...``) of a cluster that is not deregistered.
        ttl: lifetime in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800, at most 30 days).

    Returns:
        The compact JWS (audience ``gshare-internal``, claim ``gen`` = the cluster's credential generation).

    Raises:
        NotFound: ``cluster_not_found``. Conflict: ``cluster_deregistered``.
        ApplicationError: ``invalid_ttl`` outside 1 s .. 30 days.
    """
    ttl = _check_ttl(ttl)
    cluster = Cluster.objects.filter(public_id=cluster_id).first()
    if cluster is None:
        raise NotFound(f"No cluster has the id {cluster_id!r}: list them with `GET /api/v1/clusters`.", code="cluster_not_found")
    issued = operator_token_issue(cluster=cluster, ttl=ttl)
    operator_token_expiry_record(cluster=cluster, issued=issued)
    return issued.token


def operator_token_exchange(*, cluster: Cluster) -> IssuedToken:
    """``POST /internal/v1/token``: a fresh token for the authenticated operator of ``cluster``.

    The caller's token has already been verified (signature, expiry, generation, cluster not deregistered);
    the new token has the cluster's current generation and ``GSHARE_OPERATOR_TOKEN_TTL`` seconds of life.
    Its expiry is recorded on the cluster.

    Returns:
        An :class:`IssuedToken` (its ``token`` goes to that operator only).

    Raises:
        Conflict: ``cluster_deregistered`` if the cluster was deregistered meanwhile.
    """
    issued = operator_token_issue(cluster=cluster)
    operator_token_expiry_record(cluster=cluster, issued=issued)
    return issued
