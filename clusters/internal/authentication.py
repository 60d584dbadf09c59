"""Authentication of the operator routes (``/internal/v1/``): the operator JWT of one cluster, never a session
cookie. The caller becomes an :class:`OperatorPrincipal` naming that cluster."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication

from clusters.models import Cluster
from clusters.operator_refusals import RefusalReason, operator_refusal_clear, operator_refusal_record
from contract import CLUSTER_DEREGISTERED, OPERATOR_TOKEN_GENERATION_CLAIM, TOKEN_REVOKED
from identity.authentication import bearer_token
from identity.errors import TOKEN_MISSING
from identity.internal_jwt import OPERATOR_AUDIENCE, InvalidInternalToken, verify_internal_jwt


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

    A refused token whose signature verified names its cluster truthfully: the refusal and its reason are
    recorded on that cluster (``clusters.operator_refusals``, at most once a minute), and the next accepted
    callback clears them. A token whose signature does not verify records nothing.
    """

    def authenticate(self, request):  # noqa: D102
        token = bearer_token(request)
        if not token:
            raise InvalidInternalToken("Send the operator token as `Authorization: Bearer <token>`.", code=TOKEN_MISSING)
        try:
            claims = verify_internal_jwt(token, OPERATOR_AUDIENCE)
        except InvalidInternalToken as exc:
            signed_subject = (exc.signed_claims or {}).get("sub")
            if isinstance(signed_subject, str) and signed_subject.startswith("operator:"):
                operator_refusal_record(reason=exc.refusal, cluster_id=signed_subject.removeprefix("operator:"))
            raise
        subject = claims.get("sub", "")
        if not subject.startswith("operator:"):
            raise InvalidInternalToken("This token is not an operator token: mint one with `manage.py mint_operator_token <cluster_id>`.")
        cluster = Cluster.objects.filter(public_id=subject.removeprefix("operator:")).first()
        if cluster is None:
            raise InvalidInternalToken(
                "This operator token names a cluster this control plane does not know: mint one with `manage.py mint_operator_token <cluster_id>`."
            )
        if cluster.status == Cluster.Status.DEREGISTERED:
            operator_refusal_record(reason=RefusalReason.CLUSTER_DEREGISTERED, cluster=cluster)
            raise InvalidInternalToken(
                "The cluster of this operator token is deregistered or unknown: register the cluster again and mint a new token.",
                code=CLUSTER_DEREGISTERED,
            )
        # The generation is compared with the row loaded above: no query of its own.
        generation = claims.get(OPERATOR_TOKEN_GENERATION_CLAIM, 1)
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
            operator_refusal_record(reason=RefusalReason.TOKEN_MALFORMED, cluster=cluster)
            raise InvalidInternalToken(
                f"This operator token's `{OPERATOR_TOKEN_GENERATION_CLAIM}` claim is malformed: mint a new one with "
                f"`manage.py mint_operator_token {cluster.public_id}`."
            )
        if generation != cluster.credential_generation:
            operator_refusal_record(reason=RefusalReason.TOKEN_REVOKED, cluster=cluster)
            raise InvalidInternalToken(
                f"This operator token was revoked (it carries credential generation {generation}; cluster {cluster.name} is at "
                f"generation {cluster.credential_generation}): push a new token with "
                f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`.",
                code=TOKEN_REVOKED,
            )
        operator_refusal_clear(cluster)
        return OperatorPrincipal(cluster=cluster, claims=claims), claims

    def authenticate_header(self, request) -> str:  # noqa: D102
        return 'Bearer realm="gshare-internal"'
