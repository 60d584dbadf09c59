"""End to end: each case of the attach guide's "When it does not work" (docs/attach.md), reproduced on the emulated
fleet with the real operator process and the control plane on a live HTTP server, and answered where the operator
looks: the connection test's ``checks`` and ``detail``, ``GET /api/v1/clusters/{id}``, the cluster's console page and
the operator's log, each naming the fix."""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import kubernetes
import pytest
import yaml
from django.urls import reverse

from clusters import services
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from tests.helpers import Http, kubeconfig_text, registered, serving, silent_kubeconfig, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CONSOLE_PAGE = b"<!doctype html><html><head><title>Log in | gShare</title></head><body>the console</body></html>"
INGRESS_403 = b"<html><head><title>403 Forbidden</title></head><body><center><h1>403 Forbidden</h1></center></body></html>"


@contextmanager
def answering(status: int, body: bytes):
    """A loopback HTTP server answering every request with ``status`` and the HTML ``body``; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = _answer

        def log_message(self, format, *args):
            pass

    with serving(Handler) as url:
        yield url


def connection_test(http, cluster: Cluster) -> dict:
    response = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test")
    assert response.status_code == 200, response.text
    return response.json()


def problems(http, cluster: Cluster) -> dict[str, str]:
    response = http.get(f"/api/v1/clusters/{cluster.public_id}")
    assert response.status_code == 200, response.text
    return {p["check"]: p["detail"] for p in response.json()["problems"]}


def cluster_page(admin_client, cluster: Cluster) -> str:
    return admin_client.get(reverse("admin:clusters_cluster_change", args=[cluster.pk])).content.decode()


def core_v1(emulated) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config_dict(yaml.safe_load(kubeconfig_text(emulated))))


def reported(cluster: Cluster, name: str, ok: bool) -> bool:
    checks = Cluster.objects.values_list("operator_checks", flat=True).get(pk=cluster.pk)
    return (checks.get(name) or {}).get("ok") is ok


# --------------------------------------------------------------------------- registered, but no nodes appear


@pytest.mark.parametrize(
    ("case", "log_says"),
    [
        ("public console", "the internal plane is closed"),
        ("ingress source range", "add this cluster's egress address to the control plane chart's `ingress.internalPlane.sourceRange`"),
        ("dns", "DNS failure: gshare-internal.invalid does not resolve from this cluster"),
    ],
)
def test_registered_but_no_nodes_appear(fleet_cluster, operator_process, tmp_path, http, admin_client, case, log_says):
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    page, status = {"public console": (CONSOLE_PAGE, 200), "ingress source range": (INGRESS_403, 403)}.get(case, (b"", 0))
    with answering(status or 200, page) as url:
        control_plane = "http://gshare-internal.invalid:8000" if case == "dns" else url
        _, log = operator_process(cluster, kubeconfig_path, token_path, env={"GSHARE_CONTROL_PLANE_URL": control_plane})
        wait_for(lambda: log_says in log.read_text(), timeout=30, what=f"the operator's log line: {log_says}")

    cluster.refresh_from_db()
    assert cluster.last_heartbeat_at is None and not cluster.nodes.exists()
    result = connection_test(http, cluster)
    assert result["checks"]["operator_reporting"] is False and result["status"] == "degraded"
    detail = result["detail"]["operator_reporting"]
    assert detail.startswith("The operator has never reported.")
    for fix in ("`kubectl -n gshare-system logs deploy/gshare-operator`", "`ingress.internalPlane.enabled=true`",
                "`ingress.internalPlane.sourceRange`"):
        assert fix in detail
    assert problems(http, cluster)["operator_reporting"] == detail
    page_html = cluster_page(admin_client, cluster)
    assert 'class="gs-problems"' in page_html and "The operator has never reported." in page_html
    assert "<code>kubectl -n gshare-system logs deploy/gshare-operator</code>" in page_html


def test_an_operator_that_stopped_reporting_says_since_when(fleet_cluster, operator_process, tmp_path, http, settings):
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c2")
    process, _ = operator_process(cluster, kubeconfig_path, token_path)
    wait_for(lambda: Cluster.objects.get(pk=cluster.pk).last_heartbeat_at is not None, what="the first report")
    process.terminate()
    assert process.wait(15) == 0
    settings.GSHARE_HEARTBEAT_STALE_SECONDS = 1
    time.sleep(1.5)
    cluster.refresh_from_db()
    detail = connection_test(http, cluster)["detail"]["operator_reporting"]
    assert detail.startswith(f"The operator has not reported since {cluster.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC (")
    assert "deploy/gshare-operator" in detail


# --------------------------------------------------------------------------- registration refused with a runtime error


@pytest.mark.parametrize(
    ("left_out", "code"),
    [(("RuntimeClass", "nvidia"), "runtime_class_missing"), (("DaemonSet", "hami-device-plugin"), "hami_missing")],
)
def test_registration_refused_with_a_runtime_error_names_attach_and_the_steps_by_hand(fleet_cluster, http, left_out, code):
    kind, name = left_out
    objects = [o for o in fleet.cluster_objects("lab-c1") if not (o["kind"] == kind and name in o["metadata"]["name"])]
    emulated = fleet_cluster("lab-c1", objects=objects)
    response = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(emulated)})
    assert (response.status_code, response.json()["code"]) == (422, code)
    detail = response.json()["detail"]
    assert "`hack/attach-cluster.sh`" in detail and "docs/attach-a-cluster.md" in detail
    assert not Cluster.objects.filter(name="lab-c1").exists()


# --------------------------------------------------------------------------- registration hangs, then fails


def test_registration_that_hangs_says_where_the_probe_ran_what_it_dialled_and_its_budget(silent_listener, http, settings):
    settings.GSHARE_PROBE_TIMEOUT = 1.5
    response = http.post("/api/v1/clusters", json={"name": "far", "kubeconfig": yaml.safe_dump(silent_kubeconfig(silent_listener))})
    assert (response.status_code, response.json()["code"]) == (504, "cluster_unreachable")
    detail = response.json()["detail"]
    assert f"The apiserver at http://{silent_listener} did not answer within 1.5 s" in detail
    assert "GSHARE_PROBE_TIMEOUT" in detail
    assert "from the control plane's pods, not from your machine" in detail


# --------------------------------------------------------------------------- sessions start but the URL 404s


def test_a_session_domain_that_does_not_reach_the_ingress_node(fleet_cluster, operator_process, tmp_path, http, admin_client,
                                                               live_server, settings):
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url  # the auth-url answers: only the DNS record is wrong
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    ingress_node = "lab-c1-cp-01"
    services.cluster_update(cluster=cluster, changes={"session_domain": "lab-c1.sessions.invalid", "ingress_node": ingress_node})
    _, log = operator_process(cluster, kubeconfig_path, token_path)
    wait_for(lambda: reported(cluster, "session_domain_resolves", False), timeout=30, what="the failed DNS check")
    assert "session path check session_domain_resolves failed: lab-c1.sessions.invalid does not resolve inside the cluster" in log.read_text()

    cluster.refresh_from_db()
    result = connection_test(http, cluster)
    assert result["checks"]["session_domain_resolves"] is False and result["status"] == "degraded"
    detail = result["detail"]["session_domain_resolves"]
    assert "lab-c1.sessions.invalid does not resolve inside the cluster" in detail
    assert f"`PATCH /api/v1/clusters/{cluster.public_id}` with `{{\"session_domain\": " in detail
    assert problems(http, cluster)["session_domain_resolves"] == detail
    assert "does not resolve inside the cluster" in cluster_page(admin_client, cluster)

    # A name that resolves, but not to the registered ingress node (a GPU node: the ingress runs elsewhere).
    patched = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": "lab-c1.localhost", "ingress_node": "gpu-h100-01"})
    assert patched.status_code == 200, patched.text
    wait_for(lambda: "which is not an address of the ingress node gpu-h100-01" in
             (Cluster.objects.get(pk=cluster.pk).operator_checks.get("session_domain_resolves") or {}).get("detail", ""),
             timeout=30, what="the check against the ingress node's addresses")

    # The fix, as the detail says: record the node that runs the ingress controller (it lists the loopback address
    # where the name resolves: the fleet's ingress node).
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"ingress_node": ingress_node}).status_code == 200
    assert "127.0.0.1" in [a.address for a in core_v1(emulated).read_node(ingress_node).status.addresses]
    wait_for(lambda: reported(cluster, "session_domain_resolves", True), timeout=30, what="the DNS check passing")
    wait_for(lambda: reported(cluster, "verify_reachable", True), timeout=30, what="the verify check passing")
    cluster.refresh_from_db()
    result = connection_test(http, cluster)
    assert result["checks"]["session_domain_resolves"] is True and result["status"] == "connected", result


# --------------------------------------------------------------------------- connecting returns 401


def test_a_verify_url_the_cluster_cannot_reach(fleet_cluster, operator_process, tmp_path, http, admin_client, live_server, settings):
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c2")
    with answering(200, CONSOLE_PAGE) as public:
        settings.GSHARE_CONTROL_PLANE_URL = public  # session Ingresses' auth-url: a host where the console answers
        _, log = operator_process(cluster, kubeconfig_path, token_path)
        wait_for(lambda: reported(cluster, "verify_reachable", False), timeout=30, what="the failed verify check")
    assert "session path check verify_reachable failed" in log.read_text()

    cluster.refresh_from_db()
    result = connection_test(http, cluster)
    assert result["checks"]["verify_reachable"] is False and result["status"] == "degraded"
    detail = result["detail"]["verify_reachable"]
    assert f"The session Ingresses' auth-url {public}/internal/connect/verify" in detail
    assert "the internal plane is closed" in detail and "`ingress.internalPlane.sourceRange`" in detail
    assert "verify_reachable" in problems(http, cluster)
    assert "auth-url" in cluster_page(admin_client, cluster)

    settings.GSHARE_CONTROL_PLANE_URL = live_server.url  # the fix: the host the cluster reaches
    wait_for(lambda: reported(cluster, "verify_reachable", True), timeout=30, what="the verify check passing")
    cluster.refresh_from_db()
    result = connection_test(http, cluster)
    assert result["checks"]["verify_reachable"] is True
    passed = Cluster.objects.get(pk=cluster.pk).operator_checks["verify_reachable"]["detail"]
    assert re.search(r"answers 401 [a-z_]+ to a request without a token, as it should", passed), passed


def test_an_operator_that_predates_the_checks_leaves_them_unknown(fleet_cluster, http, live_server):
    emulated = fleet_cluster("lab-c1")
    cluster = services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain="lab-c1.localhost")
    token = operator_token_mint(cluster_id=cluster.public_id)
    # An older operator's inventory: no "checks".
    answer = Http(live_server.url, token).put("/internal/v1/inventory", json=fleet.expected_inventory("lab-c1")["snapshot"])
    assert answer.status_code == 200
    assert answer.json()["session_domain"] == "lab-c1.localhost"
    cluster.refresh_from_db()
    result = connection_test(http, cluster)
    assert "session_domain_resolves" not in result["checks"] and "verify_reachable" not in result["checks"]
    assert result["detail"]["verify_reachable"].startswith("Unknown, not failed: the operator has not reported this check yet.")
    assert result["status"] == "connected"


# --------------------------------------------------------------------------- expired token, 401 while pods keep running


def test_an_expired_token_turns_the_dashboard_and_the_cluster_page_red_while_the_pods_keep_running(
    fleet_cluster, operator_process, tmp_path, http, admin_client, settings, live_server
):
    settings.GSHARE_JWT_LEEWAY = 0
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1", pod_startup_seconds=0.2)
    _, log = operator_process(cluster, kubeconfig_path, token_path)
    wait_for(lambda: http.get(f"/api/v1/gpus?cluster={cluster.public_id}").json()["count"] > 0, what="inventory")
    created = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    wait_for(lambda: http.get(f"/api/v1/sessions/{session_id}").json()["phase"] == "Running", what="Running", timeout=60)

    # The token in the operator's file expires (no Secret, no self-refresh in time): every callback gets 401.
    expired = operator_token_mint(cluster_id=cluster.public_id, ttl=1)
    time.sleep(1.5)  # expired before the operator reads it, so it cannot exchange it for a fresh one either
    token_path.write_text(expired)
    wait_for(lambda: "operator token expired or revoked: rotate it" in log.read_text(), timeout=30, what="the 401 line")
    assert f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`" in log.read_text()
    wait_for(lambda: Cluster.objects.get(pk=cluster.pk).operator_refused_reason == "token_expired", what="the recorded refusal")

    pod_name = session_id.replace("_", "-")
    [pod] = [p for p in emulated.objects_of("pods") if p["metadata"]["name"] == pod_name]
    assert pod["status"]["phase"] == "Running"  # the session keeps running: its Pod needs no operator token
    assert http.get(f"/api/v1/sessions/{session_id}").json()["phase"] == "Running"

    rotate = f"manage.py rotate_operator_tokens --cluster {cluster.public_id}"
    cluster.refresh_from_db()
    found = problems(http, cluster)
    assert found["operator_token"].startswith("Operator callbacks refused since") and rotate in found["operator_token"]
    page_html = cluster_page(admin_client, cluster)
    assert 'class="gs-problems"' in page_html and "Operator callbacks refused since" in page_html and rotate in page_html
    dashboard = admin_client.get("/").content.decode()
    assert "Operator callbacks refused since" in dashboard and rotate in dashboard
    assert 'class="gs-warn gs-warn-bad" role="note"><strong>lab-c1:</strong> Operator callbacks refused since' in dashboard
    settings.GSHARE_HEARTBEAT_STALE_SECONDS = 0
    detail = connection_test(http, cluster)["detail"]["operator_reporting"]
    assert "Its callbacks are refused since" in detail and "token_expired: its token has expired" in detail and rotate in detail

    # The rotation (here: a fresh token in the file) lets it back in, and the red goes away.
    settings.GSHARE_HEARTBEAT_STALE_SECONDS = 120
    token_path.write_text(operator_token_mint(cluster_id=cluster.public_id))
    wait_for(lambda: Cluster.objects.get(pk=cluster.pk).operator_refused_since is None, timeout=30, what="the refusal cleared")
    assert "Operator callbacks refused" not in admin_client.get("/").content.decode()
    assert http.delete(f"/api/v1/sessions/{session_id}").status_code == 202
