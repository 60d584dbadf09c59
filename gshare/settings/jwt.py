"""Internal JWT settings (identity/internal_jwt.py)."""

from .env import env

#: ``iss`` of every internal JWT the control plane signs.
GSHARE_JWT_ISSUER = env.str("GSHARE_JWT_ISSUER", default="gshare-control-plane")
#: Default lifetime of an operator token, seconds (7 days).
GSHARE_OPERATOR_TOKEN_TTL = env.int("GSHARE_OPERATOR_TOKEN_TTL", default=604800)
#: Allowed clock skew when verifying ``exp``/``nbf``/``iat``, seconds.
GSHARE_JWT_LEEWAY = env.int("GSHARE_JWT_LEEWAY", default=30)
#: RSA modulus size of new signing keys, bits.
GSHARE_JWT_KEY_BITS = env.int("GSHARE_JWT_KEY_BITS", default=2048)
