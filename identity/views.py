"""The public JWKS: the keys that verify internal JWTs."""

from __future__ import annotations

from django.http import JsonResponse

from core.views import get_only
from identity.internal_jwt import public_jwks


@get_only
def jwks(request):
    """``GET /.well-known/gshare-internal-jwks.json``: public keys of every published signing key."""
    response = JsonResponse(public_jwks())
    response["Cache-Control"] = "public, max-age=300"
    return response
