"""Operator tokens: one concern in two modules.

* ``clusters.operator_token.tokens``: minting, issuing and exchanging the RS256 internal JWTs an operator
  authenticates with (subject ``operator:<cluster_id>``, generation claim ``gen``), and recording their expiry;
* ``clusters.operator_token.rotation``: pushing a fresh token into the cluster's Secret through its apiserver, the
  daily rotation, the state and warning the API and console show, and revocation by credential generation.
"""

from clusters.operator_token.rotation import (
    OperatorTokenPushFailed,
    OperatorTokenPushUnavailable,
    Outcome,
    TokenRotationResult,
    credential_generation_bump,
    operator_token_push,
    operator_token_push_retry,
    operator_token_state,
    operator_tokens_revoke,
    operator_tokens_rotate,
)
from clusters.operator_token.tokens import (
    IssuedToken,
    TokenRefreshThrottled,
    TokenRefreshTooEarly,
    operator_token_exchange,
    operator_token_issue,
    operator_token_mint,
)

__all__ = [
    "IssuedToken",
    "OperatorTokenPushFailed",
    "OperatorTokenPushUnavailable",
    "Outcome",
    "TokenRefreshThrottled",
    "TokenRefreshTooEarly",
    "TokenRotationResult",
    "credential_generation_bump",
    "operator_token_exchange",
    "operator_token_issue",
    "operator_token_mint",
    "operator_token_push",
    "operator_token_push_retry",
    "operator_token_state",
    "operator_tokens_revoke",
    "operator_tokens_rotate",
]
