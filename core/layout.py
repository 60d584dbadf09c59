"""Where in every cluster the control plane acts: the settings an attach run and ``GET /api/v1/version`` agree on."""

from __future__ import annotations

from django.conf import settings

#: Labels of a Secret the control plane creates in a cluster (the operator token Secret, when the attach or a rotation
#: finds it missing; a Secret made by the operator chart keeps its own labels).
CONTROL_PLANE_SECRET_LABELS = {"app.kubernetes.io/part-of": "gshare", "app.kubernetes.io/managed-by": "gshare-control-plane"}


def cluster_layout() -> dict:
    """The settings that decide which Kubernetes objects the control plane touches in each cluster:
    ``{"session_namespace", "operator_namespace", "operator_token_secret", "volume_move_enabled"}``."""
    return {
        "session_namespace": settings.GSHARE_SESSION_NAMESPACE,
        "operator_namespace": settings.GSHARE_OPERATOR_NAMESPACE,
        "operator_token_secret": settings.GSHARE_OPERATOR_TOKEN_SECRET,
        "volume_move_enabled": bool(settings.GSHARE_VOLUME_MOVE_ENABLED),
    }
