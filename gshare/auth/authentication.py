"""DRF authentication classes: user API tokens (public API) and operator JWTs (``/internal``)."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication

from gshare.auth.internal_jwt import OPERATOR_AUDIENCE, InvalidInternalToken, verify_internal_jwt
from gshare.auth.tokens import api_token_authenticate
from operator_agent.contract import OPERATOR_TOKEN_GENERATION_CLAIM, TOKEN_REVOKED


def _bearer(request) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return ""
    return value.strip()


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gsh_...`` -> ``(user, ApiToken)``."""

    def authenticate(self, request):  # noqa: D102
        token = _bearer(request)
        if token is None:
            return None
        row = api_token_authenticate(token=token)
        return row.user, row

    def authenticate_header(self, request) -> str:  # noqa: D102
        return 'Bearer realm="gshare"'


@dataclass(frozen=True)
class OperatorPrincipal:
    """The authenticated caller of an ``/internal`` route: the operator of one cluster.

    Attributes:
        cluster: the ``clusters.Cluster`` named in the token's ``sub`` (never deregistered).
        claims: the verified JWT claims.
    """

    cluster: object
    claims: dict
    is_authenticated: bool = True


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <operator JWT>`` with ``sub = operator:<cluster_id>``.

    Refuses (401) any token that :func:`verify_internal_jwt` refuses, a subject that is not an
    operator, the token of an unknown or deregistered cluster (``cluster_deregistered``), and a token
    whose credential generation (claim ``gen``, absent = 1) is not the cluster's current one
    (``token_revoked``).
    """

    def authenticate(self, request):  # noqa: D102
        from clusters.models import Cluster

        token = _bearer(request)
        if not token:
            raise InvalidInternalToken("Send the operator token as `Authorization: Bearer <token>`.", code="token_missing")
        claims = verify_internal_jwt(token, OPERATOR_AUDIENCE)
        subject = claims.get("sub", "")
        if not subject.startswith("operator:"):
            raise InvalidInternalToken("This token is not an operator token: mint one with `manage.py mint_operator_token <cluster_id>`.")
        cluster = Cluster.objects.filter(public_id=subject.removeprefix("operator:")).first()
        if cluster is None:
            raise InvalidInternalToken(
                "This operator token names a cluster this control plane does not know: mint one with `manage.py mint_operator_token <cluster_id>`."
            )
        if cluster.status == Cluster.Status.DEREGISTERED:
            raise InvalidInternalToken(
                "The cluster of this operator token is deregistered or unknown: register the cluster again and mint a new token.",
                code="cluster_deregistered",
            )
        # The generation is compared with the row loaded above: no query of its own.
        generation = claims.get(OPERATOR_TOKEN_GENERATION_CLAIM, 1)
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
            raise InvalidInternalToken(
                f"This operator token's `{OPERATOR_TOKEN_GENERATION_CLAIM}` claim is malformed: mint a new one with "
                f"`manage.py mint_operator_token {cluster.public_id}`."
            )
        if generation != cluster.credential_generation:
            raise InvalidInternalToken(
                f"This operator token was revoked (it carries credential generation {generation}; cluster {cluster.name} is at "
                f"generation {cluster.credential_generation}): push a new token with "
                f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`.",
                code=TOKEN_REVOKED,
            )
        return OperatorPrincipal(cluster=cluster, claims=claims), claims

    def authenticate_header(self, request) -> str:  # noqa: D102
        return 'Bearer realm="gshare-internal"'
