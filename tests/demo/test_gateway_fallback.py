"""gateway-api routing's fallback for ``/s/`` through the demo's Envoy Gateway stand-in (``demo.envoy_proxy``): the objects
the operator writes (``operator_agent.manifests.routing.fallback``: an HTTPRoute ``/s/`` to a Backend for the control plane)
on an emulated cluster, the control plane a live server. A stopped session's URL and an unknown id get gShare's
"session ended" page; a live session's own route (the longer prefix) still wins. tests/demo/test_ingress.py proves the
same for ingress-nginx with the operator process writing the objects."""

from __future__ import annotations

import pytest

from contract import CONNECT_EXT_AUTHZ_PATH, GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT, ROUTING_GATEWAY_API
from demo.emulator import EmulatedCluster
from demo.ingress_nginx import ClusterApi, ClusterIngress, DemoIngress
from operator_agent.manifests.routing.fallback import fallback_objects
from sessions import ext_authz
from sessions.models import Session
from tests.demo.test_gateway import DOMAIN, NAMESPACE, _crds, _gateway, _session, send
from tests.factories import ClusterFactory, SessionFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


@pytest.fixture
def stack(live_server, settings):
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    ext_authz.forget_session_domains()
    cluster = ClusterFactory(name="lab-c2", session_domain=DOMAIN)
    port = int(live_server.url.rsplit(":", 1)[1])
    gss = {"metadata": {"name": "any", "namespace": NAMESPACE},
           "spec": {"host": DOMAIN, "extAuthUrl": f"http://localhost:{port}{CONNECT_EXT_AUTHZ_PATH}",
                    "gateway": {"name": GATEWAY_NAME_DEFAULT, "namespace": GATEWAY_NAMESPACE_DEFAULT}}}
    live = SessionFactory(cluster=cluster)
    objects = [*({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (NAMESPACE, GATEWAY_NAMESPACE_DEFAULT)),
               {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}, *_crds(), *_gateway(),
               *_session(live.public_id.replace("_", "-"), f"/s/{live.public_id}/", port),
               *fallback_objects(gss, ROUTING_GATEWAY_API)]
    with EmulatedCluster(objects) as emulated:
        ingress = DemoIngress([ClusterIngress("lab-c2", DOMAIN, ClusterApi(server=emulated.url))], poll_seconds=3600).start()
        try:
            yield {"ingress": ingress, "host": f"{DOMAIN}:{ingress.port}", "cluster": cluster, "live": live}
        finally:
            ingress.stop()
            ext_authz.forget_session_domains()


def test_a_stopped_sessions_url_and_an_unknown_id_get_gshares_page_through_envoy(stack):
    stopped = SessionFactory(cluster=stack["cluster"], phase=Session.Phase.TERMINATED)
    status, headers, body = send(stack, "GET", f"/s/{stopped.public_id}/lab/tree?token=secret")
    page = body.decode()
    assert status == 404 and "This session has ended or does not exist" in page, (status, page[:300])
    assert "secret" not in page and stopped.owner.username not in page
    unknown = "ses_" + "c" * 16
    status, _, other = send(stack, "GET", f"/s/{unknown}/")
    assert status == 404 and other.decode().replace(unknown, "ID") == page.replace(stopped.public_id, "ID")


def test_a_live_sessions_own_route_still_wins(stack):
    live = stack["live"]
    status, _, body = send(stack, "GET", f"/s/{live.public_id}/lab")
    # Its route (the longer prefix) and its ext_authz check: no connect token, refused; never the fallback's page.
    assert status in (401, 403) and b"This session has ended" not in body, (status, body[:200])


def test_outside_the_session_prefix_is_still_envoys_404(stack):
    status, _, body = send(stack, "GET", "/elsewhere/")
    assert (status, body) == (404, b"")
