"""The error codes of clusters: registration and changes, the connection probe, the operator API's inventory, and the
operator tokens (exchange, mint, rotation push). The codes the operator reads too (``cluster_deregistered``,
``forbidden_cluster_scope``, ``inventory_snapshot_required``, ``token_invalid``, ``token_revoked``) are the contract's;
the kubeconfig codes are ``kube.errors``'."""

from __future__ import annotations

# --------------------------------------------------------------------------- registration and changes
INVALID_ROUTING = "invalid_routing"
"""400: ``routing`` is not ``gateway-api`` or ``ingress-nginx``."""

INVALID_GATEWAY_NAME = "invalid_gateway_name"
"""400: ``gateway_name`` is not a lowercase DNS name."""

INVALID_GATEWAY_NAMESPACE = "invalid_gateway_namespace"
"""400: ``gateway_namespace`` is not a DNS label."""

SESSION_DOMAIN_IS_CONTROL_PLANE = "session_domain_is_control_plane"
"""400: ``session_domain`` is a host of the control plane itself."""

NAME_TAKEN = "name_taken"
"""409: a registered cluster already has this name."""

CLUSTER_ALREADY_REGISTERED = "cluster_already_registered"
"""409: the kubeconfig reaches a cluster already registered (same ``kube-system`` uid)."""

SESSION_DOMAIN_TAKEN = "session_domain_taken"
"""409: another registered cluster serves sessions at this ``session_domain``."""

CLUSTER_HAS_LIVE_SESSIONS = "cluster_has_live_sessions"
"""409: changing ``session_domain`` while sessions run on the cluster."""

CLUSTER_IDENTITY_UNKNOWN = "cluster_identity_unknown"
"""409: a new kubeconfig for a cluster whose identity was never recorded and cannot be read now."""

DIFFERENT_CLUSTER = "different_cluster"
"""409: a new kubeconfig that reaches another cluster."""

CLUSTER_BUSY = "cluster_busy"
"""409: deregistration refused while sessions or GPU allocations are live on the cluster."""

CLUSTER_PREREQUISITE_MISSING = "cluster_prerequisite_missing"
"""Default of ``ClusterPrerequisiteMissing``: every raise names ``runtime_class_missing`` or ``hami_missing``."""

RUNTIME_CLASS_MISSING = "runtime_class_missing"
"""422: the cluster has no RuntimeClass ``nvidia``."""

HAMI_MISSING = "hami_missing"
"""422: the cluster has no HAMi device-plugin DaemonSet."""

# --------------------------------------------------------------------------- reaching a cluster
CLUSTER_NOT_FOUND = "cluster_not_found"
"""404: no cluster has that id (or name, where a name is accepted)."""

CLUSTER_UNAVAILABLE = "cluster_unavailable"
"""409: the cluster cannot take new work now (not connected, deregistered, or without a ``session_domain``)."""

CLUSTER_UNREACHABLE = "cluster_unreachable"
"""504: the cluster's apiserver did not answer in time (or what answered is not an apiserver)."""

CLUSTER_AUTH_FAILED = "cluster_auth_failed"
"""400: the apiserver refused the kubeconfig's credentials (401/403)."""

# --------------------------------------------------------------------------- operator API
INVALID_INVENTORY = "invalid_inventory"
"""400: an inventory snapshot does not match the contract."""

# --------------------------------------------------------------------------- operator tokens
TOKEN_REFRESH_TOO_EARLY = "token_refresh_too_early"
"""409: ``POST /internal/v1/token`` with a token that has more than a quarter of its life left."""

TOKEN_REFRESH_THROTTLED = "token_refresh_throttled"
"""429: too many token exchanges for this cluster this minute."""

INVALID_TTL = "invalid_ttl"
"""``manage.py mint_operator_token``: the lifetime is not between 1 s and 30 days."""

TOKEN_PUSH_UNREACHABLE = "token_push_unreachable"
"""Rotation: the cluster's apiserver did not answer the push in time."""

TOKEN_PUSH_FORBIDDEN = "token_push_forbidden"
"""Rotation: the apiserver refused to let the control plane write the token Secret (401/403)."""

TOKEN_PUSH_NAMESPACE_MISSING = "token_push_namespace_missing"
"""Rotation: the operator's namespace does not exist on the cluster."""

TOKEN_PUSH_REVOKED = "token_push_revoked"
"""Rotation: the cluster's tokens were revoked (or it was deregistered) while the token was pushed."""

TOKEN_PUSH_FAILED = "token_push_failed"
"""Rotation: any other failure of the push (an unusable kubeconfig, an unexpected apiserver answer)."""

UNANSWERED = frozenset({CLUSTER_PREREQUISITE_MISSING})
"""Codes above that no request can get; docs/errors.md does not list them."""
