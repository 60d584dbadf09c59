"""DRF authentication classes of the public API: user API tokens and the console's login session.

The public API (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``) tries ``Authorization: Bearer <api token>``
first, then the console's login session (:class:`ConsoleSessionAuthentication`, CSRF enforced on unsafe methods), so
a browser logged in to the console (the API documentation's "Try it out", the console's own scripts) calls the API as
that user. The operator routes (``/internal/v1/``) use ``clusters.internal.authentication`` alone: a session cookie
is never accepted there.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import authentication, exceptions

from core.exceptions import ApplicationError
from identity.errors import CSRF_FAILED
from identity.tokens import api_token_authenticate


def bearer_token(request) -> str | None:
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
        token = bearer_token(request)
        if token is None:
            return None
        row = api_token_authenticate(token=token)
        return row.user, row

    def authenticate_header(self, request) -> str:  # noqa: D102
        return 'Bearer realm="gshare"'


class CsrfFailed(ApplicationError):
    """403: a request authenticated by the console's login session came without a valid CSRF token."""

    code = CSRF_FAILED
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
