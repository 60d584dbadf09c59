"""Internal JWTs: signing, every refusal, the JWKS, key rotation without downtime."""

import base64
import json
import time

import jwt
import pytest

from identity.internal_jwt import (
    CONNECT_AUDIENCE,
    OPERATOR_AUDIENCE,
    InvalidInternalToken,
    public_jwks,
    sign_internal_jwt,
    verify_internal_jwt,
)
from identity.keys import signing_key_create, signing_key_ensure
from identity.models import SigningKey

pytestmark = pytest.mark.django_db


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_round_trip_has_every_claim():
    token = sign_internal_jwt("operator:clu_abc", 600)
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256"
    assert header["kid"] == signing_key_ensure().kid
    claims = verify_internal_jwt(token, OPERATOR_AUDIENCE)
    assert claims["sub"] == "operator:clu_abc"
    assert claims["aud"] == OPERATOR_AUDIENCE
    assert claims["exp"] - claims["iat"] == 600
    assert {"iss", "nbf", "jti"} <= set(claims)


def test_expired_is_refused():
    key = signing_key_ensure()
    now = int(time.time())
    token = jwt.encode(
        {"iss": "gshare-control-plane", "sub": "operator:x", "aud": OPERATOR_AUDIENCE, "iat": now - 7200,
         "nbf": now - 7200, "exp": now - 3600, "jti": "1"},
        key.private_key_pem, algorithm="RS256", headers={"kid": key.kid},
    )
    with pytest.raises(InvalidInternalToken, match="expired"):
        verify_internal_jwt(token, OPERATOR_AUDIENCE)


def test_wrong_audience_is_refused():
    token = sign_internal_jwt("operator:clu_abc", 600, audience=CONNECT_AUDIENCE)
    with pytest.raises(InvalidInternalToken, match="audience"):
        verify_internal_jwt(token, OPERATOR_AUDIENCE)


def test_tampered_payload_is_refused():
    token = sign_internal_jwt("operator:clu_abc", 600)
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "operator:clu_other"
    with pytest.raises(InvalidInternalToken):
        verify_internal_jwt(f"{header}.{_b64(claims)}.{signature}", OPERATOR_AUDIENCE)


def test_unknown_kid_is_refused():
    token = sign_internal_jwt("operator:clu_abc", 600)
    header, payload, signature = token.split(".")
    forged = _b64({"alg": "RS256", "typ": "JWT", "kid": "not-a-key"})
    with pytest.raises(InvalidInternalToken, match="does not publish"):
        verify_internal_jwt(f"{forged}.{payload}.{signature}", OPERATOR_AUDIENCE)


def test_alg_none_is_refused():
    now = int(time.time())
    claims = {"iss": "gshare-control-plane", "sub": "operator:x", "aud": OPERATOR_AUDIENCE, "iat": now, "nbf": now, "exp": now + 60, "jti": "1"}
    token = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': signing_key_ensure().kid})}.{_b64(claims)}."
    with pytest.raises(InvalidInternalToken, match="RS256"):
        verify_internal_jwt(token, OPERATOR_AUDIENCE)


def test_hs256_signed_with_the_public_key_is_refused():
    # The classic key-confusion attack: HMAC keyed with the published RSA public key.
    key = signing_key_ensure()
    now = int(time.time())
    claims = {"iss": "gshare-control-plane", "sub": "operator:x", "aud": OPERATOR_AUDIENCE, "iat": now, "nbf": now, "exp": now + 60, "jti": "1"}
    header = _b64({"alg": "HS256", "typ": "JWT", "kid": key.kid})
    body = _b64(claims)
    import hashlib
    import hmac

    signature = base64.urlsafe_b64encode(
        hmac.new(key.public_key_pem.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    ).rstrip(b"=").decode()
    with pytest.raises(InvalidInternalToken, match="RS256"):
        verify_internal_jwt(f"{header}.{body}.{signature}", OPERATOR_AUDIENCE)


def test_garbage_is_refused():
    with pytest.raises(InvalidInternalToken, match="not a JWT"):
        verify_internal_jwt("not-a-token", OPERATOR_AUDIENCE)


def test_rotation_keeps_old_tokens_valid_until_retired():
    old_token = sign_internal_jwt("operator:clu_abc", 600)
    old_kid = jwt.get_unverified_header(old_token)["kid"]
    new_key = signing_key_create()
    new_token = sign_internal_jwt("operator:clu_abc", 600)
    assert jwt.get_unverified_header(new_token)["kid"] == new_key.kid
    assert {k["kid"] for k in public_jwks()["keys"]} == {old_kid, new_key.kid}
    assert verify_internal_jwt(old_token, OPERATOR_AUDIENCE)["sub"] == "operator:clu_abc"
    SigningKey.objects.filter(kid=old_kid).update(status=SigningKey.Status.RETIRED)
    with pytest.raises(InvalidInternalToken):
        verify_internal_jwt(old_token, OPERATOR_AUDIENCE)
    assert {k["kid"] for k in public_jwks()["keys"]} == {new_key.kid}


def test_jwks_verifies_tokens(client):
    token = sign_internal_jwt("operator:clu_abc", 600)
    body = client.get("/.well-known/gshare-internal-jwks.json").json()
    (jwk,) = body["keys"]
    assert jwk["alg"] == "RS256" and jwk["kty"] == "RSA" and {"kid", "n", "e"} <= set(jwk)
    assert "d" not in jwk and "p" not in jwk  # public half only
    public = jwt.PyJWK(jwk).key
    assert jwt.decode(token, public, algorithms=["RS256"], audience=OPERATOR_AUDIENCE)["sub"] == "operator:clu_abc"


def test_private_key_is_encrypted_at_rest():
    key = signing_key_ensure()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT private_key_pem FROM gshare_signingkey WHERE id = %s", [key.pk])
        (raw,) = cursor.fetchone()
    assert "PRIVATE KEY" not in raw
    assert key.private_key_pem.startswith("-----BEGIN PRIVATE KEY-----")
