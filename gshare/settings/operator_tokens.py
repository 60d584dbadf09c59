"""Operator token rotation settings (clusters/operator_token/rotation.py). ``GSHARE_OPERATOR_TOKEN_TTL`` is in ``jwt``."""

from .env import env

#: Namespace of the operator (and of its token Secret) on every data-plane cluster.
GSHARE_OPERATOR_NAMESPACE = env.str("GSHARE_OPERATOR_NAMESPACE", default="gshare-system")
#: Name of the Secret holding the operator token (key ``internal-jwt``) in that namespace.
GSHARE_OPERATOR_TOKEN_SECRET = env.str("GSHARE_OPERATOR_TOKEN_SECRET", default="gshare-operator-internal-jwt")
#: Show a warning (API, console) when a cluster's newest operator token expires within this many seconds (3 days).
GSHARE_OPERATOR_TOKEN_WARN_BEFORE = env.int("GSHARE_OPERATOR_TOKEN_WARN_BEFORE", default=259200)
#: The daily rotation skips a cluster whose token was pushed less than this many seconds ago (12 h), so a
#: second run the same day changes nothing.
GSHARE_OPERATOR_TOKEN_ROTATE_MIN_AGE = env.int("GSHARE_OPERATOR_TOKEN_ROTATE_MIN_AGE", default=43200)
#: Seconds one push (read + write of the Secret through the cluster's apiserver) may take in all.
GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT = env.float("GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT", default=10.0)
