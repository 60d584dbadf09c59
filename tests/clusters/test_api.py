"""The clusters API through HTTP (live server), against emulated apiservers on loopback."""


import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import Cluster, GpuDevice, Node
from clusters.signals import cluster_deregistering
from demo import fleet
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import kubeconfig_text, load_kubeconfig_fixture, silent_kubeconfig

pytestmark = pytest.mark.django_db


def register(http, cluster, name="lab", **extra):
    body = {"name": name, "kubeconfig": kubeconfig_text(cluster), "session_domain": f"{name}.gpu.example.com",
            "ingress_node": "gpu-node-01", "volume_storage_class": "nfs", **extra}
    return http.post("/api/v1/clusters", json=body)


def test_register_probes_and_never_returns_the_kubeconfig(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    response = register(http, emulated)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"].startswith("clu_")
    assert body["status"] == "pending"
    assert body["kubernetes_version"] == fleet.cluster_version("lab-c1")["gitVersion"]
    assert body["session_domain"] == "lab.gpu.example.com"
    assert "kubeconfig" not in body and "emulator-token" not in response.text
    row = Cluster.objects.get(public_id=body["id"])
    assert "emulator-token" in row.kubeconfig  # decrypted in memory
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig FROM clusters_cluster WHERE id = %s", [row.pk])
        assert "emulator-token" not in cursor.fetchone()[0]  # encrypted at rest
    listed = http.get("/api/v1/clusters").json()
    assert listed["count"] == 1 and "emulator-token" not in str(listed)
    assert http.get(f"/api/v1/clusters/{body['id']}").json()["name"] == "lab"


@pytest.mark.parametrize(
    ("fixture", "code"),
    [
        ("eks-exec-aws-eks-get-token.yaml", "kubeconfig_exec_forbidden"),
        ("oidc-auth-provider.yaml", "kubeconfig_exec_forbidden"),
        ("ca-file-paths-minikube.yaml", "kubeconfig_local_file"),
        ("k3s.yaml", "kubeconfig_localhost"),
        ("kubectl-config-view-redacted.yaml", "kubeconfig_invalid"),
        ("multi-context-empty-current-context.yaml", "kubeconfig_invalid"),
    ],
)
def test_kubeconfig_refusals(http, fixture, code):
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": load_kubeconfig_fixture(fixture)})
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert Cluster.objects.count() == 0


def test_not_yaml_is_kubeconfig_invalid(http):
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": "{{{ not yaml"})
    assert response.status_code == 400
    assert response.json()["code"] == "kubeconfig_invalid"


def test_token_file_is_kubeconfig_local_file(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    config = emulated.kubeconfig("lab")
    config["users"][0]["user"] = {"tokenFile": "/etc/shadow"}
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(config)})
    assert response.status_code == 400
    assert response.json()["code"] == "kubeconfig_local_file"


def test_loopback_server_not_in_allowlist_is_refused(http, fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    settings.GSHARE_LOOPBACK_ALLOWLIST = []
    response = register(http, emulated)
    assert response.status_code == 400
    assert response.json()["code"] == "kubeconfig_localhost"
    assert not emulated.requests_seen()  # refused before anything was dialled


def test_missing_runtime_class_is_422(http, fleet_cluster):
    objects = [o for o in fleet.cluster_objects("lab-c1") if o["kind"] != "RuntimeClass"]
    response = register(http, fleet_cluster("lab-c1", objects=objects))
    assert response.status_code == 422
    assert response.json()["code"] == "runtime_class_missing"
    assert "RuntimeClass" in response.json()["detail"]


def test_missing_hami_is_422(http, fleet_cluster):
    objects = [o for o in fleet.cluster_objects("lab-c1") if o["kind"] != "DaemonSet"]
    response = register(http, fleet_cluster("lab-c1", objects=objects))
    assert response.status_code == 422
    assert response.json()["code"] == "hami_missing"


def test_unreachable_is_504_within_the_budget(http, silent_listener, settings):
    settings.GSHARE_PROBE_TIMEOUT = 1.5
    config = silent_kubeconfig(silent_listener)
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(config)})
    assert response.status_code == 504
    assert response.json()["code"] == "cluster_unreachable"
    # cut off by the configured budget itself (GSHARE_PROBE_TIMEOUT passed down), not by a socket timeout or the peer
    detail = response.json()["detail"]
    assert "did not answer within 1.5 s" in detail and "cut off at the deadline" in detail, detail
    assert Cluster.objects.count() == 0


def test_wrong_emulator_token_is_cluster_auth_failed(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    config = emulated.kubeconfig("lab")
    config["users"][0]["user"]["token"] = "wrong"
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(config)})
    assert response.status_code == 400
    assert response.json()["code"] == "cluster_auth_failed"


def test_name_taken_until_deregistered(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    first = register(http, emulated).json()
    again = register(http, emulated)
    assert again.status_code == 409
    assert again.json()["code"] == "name_taken"
    assert http.delete(f"/api/v1/clusters/{first['id']}").json()["status"] == "deregistered"
    assert register(http, emulated).status_code == 201
    assert Cluster.objects.filter(name="lab").count() == 2


def test_invalid_name_is_400(http, fleet_cluster):
    response = register(http, fleet_cluster("lab-c1"), name="Not A Name!")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert "name" in response.json()["detail"]


def test_only_staff_may_register(http_user, fleet_cluster):
    response = register(http_user, fleet_cluster("lab-c1"))
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


def test_patch_changes_only_editable_fields(http):
    cluster = ClusterFactory()
    response = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": "new.example.com", "ingress_node": "n2"})
    assert response.status_code == 200
    assert response.json()["session_domain"] == "new.example.com"
    refused = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"name": "renamed"})
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_request"
    cluster.refresh_from_db()
    assert cluster.name != "renamed" and cluster.ingress_node == "n2"


def test_unknown_cluster_is_404(http):
    response = http.get("/api/v1/clusters/clu_doesnotexist")
    assert response.status_code == 404
    assert response.json()["code"] == "cluster_not_found"


def test_deregister_drops_nodes_and_devices_keeps_the_row(http):
    device = GpuDeviceFactory()
    cluster = device.cluster
    response = http.delete(f"/api/v1/clusters/{cluster.public_id}")
    assert response.status_code == 200
    assert response.json()["status"] == "deregistered"
    assert Node.objects.count() == 0 and GpuDevice.objects.count() == 0
    cluster.refresh_from_db()
    assert cluster.deregistered_at is not None
    # idempotent
    assert http.delete(f"/api/v1/clusters/{cluster.public_id}").status_code == 200


def test_deregister_is_refused_while_live_allocations_exist(http):
    # A subscriber above clusters (as the sessions app is) answers that two live things still hold the cluster.
    cluster = ClusterFactory()

    def two_live(sender, **kwargs) -> int:
        return 2

    cluster_deregistering.connect(two_live, dispatch_uid="test-two-live")
    try:
        response = http.delete(f"/api/v1/clusters/{cluster.public_id}")
    finally:
        cluster_deregistering.disconnect(dispatch_uid="test-two-live")
    assert response.status_code == 409
    assert response.json()["code"] == "cluster_busy"
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.CONNECTED


def test_connection_test_reports_every_check(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated).json()["id"]
    report = http.post(f"/api/v1/clusters/{cluster_id}/connection-test").json()
    assert report["checks"] == {
        "apiserver_reachable": True, "runtime_class_nvidia": True, "hami_device_plugin": True,
        "gpu_nodes": True, "credential_least_privilege": False, "operator_reporting": False,
    }
    assert report["status"] == "degraded"
    assert "attach_cluster" in report["detail"]["credential_least_privilege"]  # an admin kubeconfig: advisory
    assert "operator" in report["detail"]["operator_reporting"]
    Cluster.objects.filter(public_id=cluster_id).update(last_heartbeat_at=Cluster.objects.get(public_id=cluster_id).registered_at)
    from django.utils import timezone

    Cluster.objects.filter(public_id=cluster_id).update(last_heartbeat_at=timezone.now())
    report = http.post(f"/api/v1/clusters/{cluster_id}/connection-test").json()
    assert report["status"] == "connected" and report["checks"]["credential_least_privilege"] is False
    shown = http.get(f"/api/v1/clusters/{cluster_id}").json()["last_connection_test"]
    assert shown["status"] == "connected" and shown["checks"]["credential_least_privilege"] is False


def test_connection_test_unreachable(http, silent_listener, settings):
    settings.GSHARE_PROBE_TIMEOUT = 1.0
    config = silent_kubeconfig(silent_listener)
    cluster = ClusterFactory(kubeconfig=yaml.safe_dump(config), apiserver_url=f"http://{silent_listener}")
    report = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test").json()
    assert report["status"] == "unreachable"
    assert report["checks"]["apiserver_reachable"] is False
    assert set(report["detail"]) >= {"apiserver_reachable", "runtime_class_nvidia"}
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.UNREACHABLE


def test_nodes_and_gpus_filter_by_cluster(http):
    a, b = ClusterFactory(name="alpha"), ClusterFactory(name="beta")
    for cluster in (a, b):
        for _ in range(2):
            node = NodeFactory(cluster=cluster)
            GpuDeviceFactory.create_batch(2, node=node, cluster=cluster)
    assert http.get("/api/v1/nodes").json()["count"] == 4
    nodes = http.get(f"/api/v1/nodes?cluster={a.public_id}").json()
    assert nodes["count"] == 2 and {n["cluster"] for n in nodes["results"]} == {a.public_id}
    assert nodes["results"][0]["gpu_count"] == 2
    gpus = http.get("/api/v1/gpus?cluster=beta").json()
    assert gpus["count"] == 4 and {g["cluster_name"] for g in gpus["results"]} == {"beta"}
    assert {"uuid", "model", "memory_mib", "split_count", "cores", "health", "index", "node"} <= set(gpus["results"][0])


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/clusters", "/api/v1/nodes", "/api/v1/gpus"])
def test_list_query_count_does_not_grow(client, staff_token, path):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {staff_token}"}
    client.get(path, **headers)  # the first use of a token records last_used_at (one UPDATE)
    counts = []
    for _ in range(2):
        cluster = ClusterFactory()
        for _ in range(3):
            GpuDeviceFactory.create_batch(2, node=NodeFactory(cluster=cluster), cluster=cluster)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path, **headers).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("field", ["session_domain", "ingress_node", "volume_storage_class"])
def test_malformed_names_are_refused_before_dialling(http, fleet_cluster, field):
    emulated = fleet_cluster("lab-c1")
    before = len(emulated.requests_seen())
    response = register(http, emulated, **{field: "Not a DNS name!"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert field in response.json()["detail"] and "DNS name" in response.json()["detail"]
    assert len(emulated.requests_seen()) == before
    cluster = ClusterFactory()
    patched = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={field: "UPPER_case"})
    assert patched.status_code == 400 and field in patched.json()["detail"]


def test_routing_is_set_at_registration_shown_to_staff_and_changed_with_patch(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    plain = register(http, emulated, name="plain")
    assert plain.status_code == 201, plain.text
    assert (plain.json()["routing"], plain.json()["gateway_namespace"], plain.json()["gateway_name"]) == (
        "ingress-nginx", "gshare-system", "gshare-sessions")  # left out: ingress-nginx, as for every existing cluster
    http.delete(f"/api/v1/clusters/{plain.json()['id']}")
    response = register(http, emulated, routing="gateway-api", gateway_name="sessions", gateway_namespace="edge")
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["routing"], body["gateway_namespace"], body["gateway_name"]) == ("gateway-api", "edge", "sessions")
    patched = http.patch(f"/api/v1/clusters/{body['id']}", json={"routing": "ingress-nginx"})
    assert patched.status_code == 200 and patched.json()["routing"] == "ingress-nginx"
    for change, field in (({"routing": "istio"}, "routing"), ({"gateway_name": "Not a name!"}, "gateway_name"),
                          ({"gateway_namespace": "a.b"}, "gateway_namespace")):
        refused = http.patch(f"/api/v1/clusters/{body['id']}", json=change)
        assert refused.status_code == 400 and refused.json()["code"] == f"invalid_{field}", refused.text
        assert field in refused.json()["detail"]
    row = Cluster.objects.get(public_id=body["id"])
    assert (row.routing, row.gateway_namespace, row.gateway_name) == ("ingress-nginx", "edge", "sessions")
