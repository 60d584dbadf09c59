"""``manage.py demo --gateway-cluster``: which fleet cluster is in gateway-api routing mode (checked before anything
starts)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from contract import ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX
from demo import fleet
from demo.runner import DemoOptions


def test_an_unknown_gateway_cluster_is_refused_before_anything_starts():
    with pytest.raises(CommandError, match="--gateway-cluster: no fleet cluster 'lab-c9'"):
        call_command("demo", "--gateway-cluster", "lab-c9", "--smoke")


def test_the_default_puts_lab_c2_on_gateway_api_and_none_puts_none(tmp_path):
    options = DemoOptions(port=0, state_file=tmp_path / "state.json", smoke=True)
    assert options.gateway_cluster == fleet.GATEWAY_CLUSTER_DEFAULT == "lab-c2"
    assert [options.routing(s.name) for s in fleet.FLEET] == [ROUTING_INGRESS_NGINX, ROUTING_GATEWAY_API]
    off = DemoOptions(port=0, state_file=tmp_path / "state.json", smoke=True, gateway_cluster=None)
    assert {off.routing(s.name) for s in fleet.FLEET} == {ROUTING_INGRESS_NGINX}
