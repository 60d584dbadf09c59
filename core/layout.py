"""Where in every cluster the control plane acts: the settings an attach run and ``GET /api/v1/version`` agree on."""

from __future__ import annotations

from django.conf import settings


def cluster_layout() -> dict:
    """The settings that decide which Kubernetes objects the control plane touches in each cluster:
    ``{"session_namespace", "operator_namespace", "operator_token_secret", "volume_move_enabled"}``."""
    return {
        "session_namespace": settings.GSHARE_SESSION_NAMESPACE,
        "operator_namespace": settings.GSHARE_OPERATOR_NAMESPACE,
        "operator_token_secret": settings.GSHARE_OPERATOR_TOKEN_SECRET,
        "volume_move_enabled": bool(settings.GSHARE_VOLUME_MOVE_ENABLED),
    }
