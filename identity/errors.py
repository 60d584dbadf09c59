"""The error codes of identity: API tokens, the console's login session on the API, signing keys, and the tokens the
internal routes check (operator, connect, metrics). ``token_invalid`` and ``token_revoked`` are the contract's
(``contract.TOKEN_INVALID``, ``contract.TOKEN_REVOKED``): the operator reads them."""

from __future__ import annotations

API_TOKEN_INVALID = "api_token_invalid"
"""401: the bearer API token is unknown, malformed or revoked, or its user is inactive."""

CSRF_FAILED = "csrf_failed"
"""403: an unsafe method authenticated by the console's login session came without a valid CSRF token."""

TOKEN_MISSING = "token_missing"
"""401: an internal route (operator API, connect verify, metrics) was called without its token."""

USER_NOT_FOUND = "user_not_found"
"""404: no user has that username."""

SIGNING_KEY_INVALID = "signing_key_invalid"
"""``manage.py import_signing_key``: the file is not an importable RSA private key."""
