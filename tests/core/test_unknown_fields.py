"""PATCH bodies naming a field the endpoint cannot change are refused by one serializer mixin, before validation."""

from __future__ import annotations

import pytest

from clusters.api.serializers import ClusterUpdateSerializer
from core.exceptions import ApplicationError
from storage.api.serializers import PoolUpdateSerializer, VolumeUpdateSerializer


@pytest.mark.parametrize(("serializer", "body", "detail"), [
    (VolumeUpdateSerializer, {"quota_gb": 2, "pool": "pool_x", "name": 1}, "Only quota_gb can be changed; not name, pool."),
    (PoolUpdateSerializer, {"capacity_bytes": 1},
     "Only name, cluster, storage_class, sharing, allowed_clusters, manual_capacity_gb, storage_node can be changed; not capacity_bytes."),
    (ClusterUpdateSerializer, {"name": "x", "session_domain": "bad domain"},
     "Only session_domain, ingress_node, volume_storage_class, routing, gateway_name, gateway_namespace and kubeconfig can be "
     "changed; to change name, deregister and register again."),
])
def test_unknown_fields_are_refused_first(serializer, body, detail):
    with pytest.raises(ApplicationError) as refused:
        serializer(data=body, partial=True).is_valid(raise_exception=True)
    assert refused.value.code == "invalid_request" and refused.value.detail == detail


def test_known_fields_pass_to_validation():
    data = VolumeUpdateSerializer(data={"quota_gb": 3})
    assert data.is_valid() and data.validated_data == {"quota_gb": 3}
    assert not VolumeUpdateSerializer(data={"quota_gb": "3"}).is_valid()  # the field's own checks still apply
