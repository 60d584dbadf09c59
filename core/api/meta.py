"""``GET /api/v1/version`` and ``GET /api/v1/me``: what a client (the attach command on an operator's laptop) checks
before it changes anything: which release the control plane runs and whether its token is a staff token."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import permissions
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from contract import GSHARE_API_VERSION
from core.layout import cluster_layout
from core.version import GSHARE_VERSION


@extend_schema(responses=OpenApiTypes.OBJECT)
@api_view(["GET"])
@permission_classes([permissions.IsAuthenticated])
def version(request):
    """``{"version": "0.2.0", "api": "v1", "operator_contract": "v1alpha1", "cluster_layout": {...}}``: the control
    plane's release, the public API's version, the version of the operator contract (the ``GShareSession`` CRD and
    ``/internal/v1``), and where in every cluster the control plane acts (``cluster_layout()``), so a client that
    prepares a cluster (attach) grants its credential rights on the same namespaces."""
    return Response({"version": GSHARE_VERSION, "api": "v1", "operator_contract": GSHARE_API_VERSION, "cluster_layout": cluster_layout()})


@extend_schema(responses=OpenApiTypes.OBJECT)
@api_view(["GET"])
@permission_classes([permissions.IsAuthenticated])
def me(request):
    """``{"username": "...", "is_staff": bool}``: who the presented API token belongs to."""
    return Response({"username": request.user.get_username(), "is_staff": bool(request.user.is_staff)})
