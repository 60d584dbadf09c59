"""DRF authentication classes: user API tokens and the console's login session (public API), operator JWTs
(``/internal``).

The public API (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``) tries ``Authorization: Bearer <api token>``
first, then the console's login session (:class:`ConsoleSessionAuthentication`, CSRF enforced on unsafe methods), so
a browser logged in to the console (the API documentation's "Try it out", the console's own scripts) calls the API as
that user. The operator routes (``/internal/v1/``) name :class:`OperatorTokenAuthentication` alone: a session cookie
is never accepted there.
"""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import authentication, exceptions

from gshare.auth.internal_jwt import OPERATOR_AUDIENCE, InvalidInternalToken, verify_internal_jwt
from gshare.auth.tokens import api_token_authenticate
from gshare.exceptions import ApplicationError
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


class CsrfFailed(ApplicationError):
    """403: a request authenticated by the console's login session came without a valid CSRF token."""

    code = "csrf_failed"
    status = 403


class ConsoleSessionAuthentication(authentication.SessionAuthentication):
    """The console's login session (Django's session cookie) -> ``(user, None)``; DRF's ``SessionAuthentication``.

    Unsafe methods (POST, PUT, PATCH, DELETE) need Django's CSRF token, as the console's forms do: the
    ``X-CSRFToken`` header with the ``csrftoken`` cookie's value (the API documentation page sends it). A refusal is
    403 ``csrf_failed`` with the fix, in the API's ``{"code", "detail"}`` shape. An inactive user's session is no
    session (Django's auth middleware gives an anonymous user).
    """

    def enforce_csrf(self, request) -> None:
        """Raise :class:`CsrfFailed` when the CSRF check fails (DRF would raise a bare ``PermissionDenied``)."""
        try:
            super().enforce_csrf(request)
        except exceptions.PermissionDenied as exc:
            raise CsrfFailed(
                f"{exc.detail} A request with the console's login session must send the `X-CSRFToken` header with the value "
                "of the `csrftoken` cookie; or send `Authorization: Bearer <api token>` instead (no CSRF token needed)."
            ) from None


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
        from clusters.models import Cluster
        from clusters.operator_refusals import RefusalReason, operator_refusal_clear, operator_refusal_record

        token = _bearer(request)
        if not token:
            raise InvalidInternalToken("Send the operator token as `Authorization: Bearer <token>`.", code="token_missing")
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
                code="cluster_deregistered",
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


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of :class:`ApiTokenAuthentication` (``bearerAuth``), so the API documentation
    offers "Authorize" with an API token."""

    target_class = ApiTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):  # noqa: D102
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")


class ConsoleSessionScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of :class:`ConsoleSessionAuthentication`: the console's session cookie."""

    target_class = ConsoleSessionAuthentication
    name = "cookieAuth"

    def get_security_definition(self, auto_schema):  # noqa: D102
        from django.conf import settings

        return {"type": "apiKey", "in": "cookie", "name": settings.SESSION_COOKIE_NAME}
