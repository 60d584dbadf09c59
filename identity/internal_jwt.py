"""Internal JWTs: RS256 tokens the control plane signs for operators and for connect links.

Claims: ``iss`` (``GSHARE_JWT_ISSUER``), ``sub``, ``aud``, ``iat``, ``nbf``, ``exp``, ``jti``;
header ``alg: RS256`` and ``kid``. Keys live in ``gshare.SigningKey``; every key that is not
retired is published at ``/.well-known/gshare-internal-jwks.json``, so keys rotate without
downtime (``identity.keys``: a replaced key stays published until every token it signed has
expired; lifetimes are capped at ``MAX_TOKEN_TTL`` so that moment is known). Verification accepts
RS256 only (``alg: none`` and HS256 are refused before any key is touched).
"""

from __future__ import annotations

import json
import re
import time
import uuid

import jwt
from django.conf import settings

from contract import TOKEN_INVALID
from core.exceptions import ApplicationError
from identity.keys import MAX_TOKEN_TTL, signing_key_ensure, signing_keys_published

#: Audience of operator tokens (data plane -> ``/internal/v1/``).
OPERATOR_AUDIENCE = "gshare-internal"
#: Audience of connect tokens (ingress-nginx ``auth-url`` -> ``/internal/connect/verify``).
CONNECT_AUDIENCE = "gshare-connect"
ALGORITHM = "RS256"
#: What a ``kid`` may look like: the column holds at most 64 characters and every kid this control plane
#: mints is hex (``identity.keys``). Anything else (a NUL, a lone surrogate, a huge string) is refused
#: before it reaches the database, which could not even compare it.
KID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


class InvalidInternalToken(ApplicationError):
    """401: the token is missing, malformed, expired, tampered with, or for another audience.

    Attributes:
        signed_claims: None, or the claims of a token whose signature verified with a published key but which
            was refused for its claims (expired, not yet valid, another audience or issuer, a claim missing): only
            then can its ``sub`` be trusted to name the caller (``OperatorTokenAuthentication`` records the
            refusal on that cluster). A forged or unparsable token never has them.
        refusal: with ``signed_claims``, the reason code (:data:`CLAIM_REFUSALS`), else "".
    """

    code = TOKEN_INVALID
    status = 401
    signed_claims: dict | None = None
    refusal: str = ""


#: Reason codes of a validly signed token refused for its claims (``InvalidInternalToken.refusal``); any other
#: claim failure is ``token_malformed``.
CLAIM_REFUSALS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "token_expired"),
    (jwt.ImmatureSignatureError, "token_not_yet_valid"),
    (jwt.InvalidAudienceError, "token_wrong_audience"),
    (jwt.InvalidIssuerError, "token_wrong_issuer"),
)


def sign_internal_jwt(subject: str, ttl: int = 604800, *, audience: str = OPERATOR_AUDIENCE, claims: dict | None = None) -> str:
    """Sign an RS256 JWT with the active signing key.

    Args:
        subject: ``sub`` claim, e.g. ``operator:clu_ab12...``.
        ttl: lifetime in seconds (default 604800 = 7 days; at most ``MAX_TOKEN_TTL`` = 30 days, the
            bound on which key rotation relies).
        audience: ``aud`` claim (``gshare-internal`` for operators, ``gshare-connect`` for connect links).
        claims: extra claims to add (they cannot override the registered ones).

    Returns:
        The compact JWS string.

    Raises:
        ValueError: ``ttl`` is not between 1 and ``MAX_TOKEN_TTL`` seconds.
    """
    if ttl <= 0:
        raise ValueError("ttl must be a positive number of seconds")
    if ttl > MAX_TOKEN_TTL:
        raise ValueError(f"ttl must be at most {MAX_TOKEN_TTL} seconds (30 days): signing key rotation relies on that bound")
    key = signing_key_ensure()
    now = int(time.time())
    payload = dict(claims or {})
    payload.update(
        iss=settings.GSHARE_JWT_ISSUER,
        sub=subject,
        aud=audience,
        iat=now,
        nbf=now,
        exp=now + int(ttl),
        jti=uuid.uuid4().hex,
    )
    return jwt.encode(payload, key.private_key_pem, algorithm=ALGORITHM, headers={"kid": key.kid})


def token_kid(token: str) -> str:
    """Read a token's header without verifying it and return its ``kid``.

    Args:
        token: the compact JWS as received.

    Returns:
        The ``kid``, a string matching :data:`KID_PATTERN`, safe to look up in the database.

    Raises:
        InvalidInternalToken: not three base64url parts, a header that is not a JSON object (bad base64,
            not UTF-8, not JSON), ``alg`` other than RS256, or a ``kid`` that is missing, not a string or
            not of :data:`KID_PATTERN` (a NUL, a surrogate, more than 64 characters).
    """
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, ValueError, TypeError):
        # PyJWT raises DecodeError for what it recognises; the rest (e.g. a str that is not UTF-8
        # encodable) is refused the same way.
        raise InvalidInternalToken("The token is not a JWT: send the operator token from its Secret as `Authorization: Bearer <token>`.") from None
    if header.get("alg") != ALGORITHM:
        raise InvalidInternalToken("Only RS256 tokens signed by this control plane are accepted: mint a new token with `manage.py mint_operator_token`.")
    kid = header.get("kid")
    if not isinstance(kid, str) or not KID_PATTERN.fullmatch(kid):
        raise InvalidInternalToken("The token has no well-formed `kid` header: mint a new token with `manage.py mint_operator_token`.")
    return kid


def verify_internal_jwt(token: str, audience: str) -> dict:
    """Verify an internal JWT and return its claims.

    Args:
        token: the compact JWS.
        audience: the audience this endpoint accepts.

    Returns:
        The claims dict (``sub``, ``aud``, ``exp``, ...).

    Raises:
        InvalidInternalToken: unparsable token or header (see :func:`token_kid`), ``alg`` other than
            RS256, malformed, unknown or retired ``kid``, bad signature, expired / not yet valid, wrong
            ``iss`` or ``aud``, missing claims.
    """
    kid = token_kid(token)
    key = signing_keys_published().filter(kid=kid).only("public_key_pem").first()
    if key is None:
        raise InvalidInternalToken("The token was signed by a key this control plane does not publish: mint a new token with `manage.py mint_operator_token`.")
    try:
        return jwt.decode(
            token,
            key.public_key_pem,
            algorithms=[ALGORITHM],
            audience=audience,
            issuer=settings.GSHARE_JWT_ISSUER,
            leeway=settings.GSHARE_JWT_LEEWAY,
            options={"require": ["iss", "sub", "aud", "iat", "nbf", "exp", "jti"]},
        )
    except jwt.PyJWTError as exc:
        if isinstance(exc, jwt.ExpiredSignatureError):
            refused = InvalidInternalToken("The token has expired: rotate it (`manage.py mint_operator_token <cluster_id>`).")
        elif isinstance(exc, jwt.InvalidAudienceError):
            refused = InvalidInternalToken(f"The token is not meant for this endpoint (audience must be `{audience}`).")
        else:
            refused = InvalidInternalToken(f"The token was refused ({type(exc).__name__}): mint a new one with `manage.py mint_operator_token`.")
        # A bad signature or an unreadable token says nothing about who sent it; a claim failure may come from
        # a token this control plane signed, which the signature alone proves (checked again, explicitly).
        if not isinstance(exc, jwt.DecodeError):
            refused.signed_claims = _signature_verified_claims(token, key.public_key_pem)
            if refused.signed_claims is not None:
                refused.refusal = next((code for kind, code in CLAIM_REFUSALS if isinstance(exc, kind)), "token_malformed")
        raise refused from None


def _signature_verified_claims(token: str, public_key_pem: str) -> dict | None:
    """The claims of ``token`` when its RS256 signature verifies with ``public_key_pem`` (no claim is checked), else None."""
    try:
        claims = jwt.decode(token, public_key_pem, algorithms=[ALGORITHM], options={
            "verify_signature": True, "verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False,
            "verify_iss": False, "verify_sub": False, "verify_jti": False, "require": [],
        })
    except jwt.PyJWTError:
        return None
    return claims if isinstance(claims, dict) else None


def public_jwks() -> dict:
    """Return the JWKS of every key that verifies tokens now: ``{"keys": [{kty, kid, use, alg, n, e}]}``.

    The active key and every replaced key until its ``retire_after`` (``identity.keys.signing_keys_published``),
    newest first; a replaced key drops out at its ``retire_after`` even before a task marks it retired.
    """
    keys = []
    signing_key_ensure()
    for key in signing_keys_published():
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_load_public(key.public_key_pem)))
        jwk.update(kid=key.kid, use="sig", alg=ALGORITHM)
        keys.append(jwk)
    return {"keys": keys}


def _load_public(pem: str):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    return load_pem_public_key(pem.encode())
