"""The sessions API through HTTP, against emulated clusters of the demo fleet."""

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from demo import fleet
from sessions.models import Allocation, Session

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})


def test_create_places_applies_and_answers_the_cluster_url(http, live_cluster):
    cluster, emulated = live_cluster("lab-c1")
    response = start(http, name="nb", gpu_memory_mib=4096, gpu_cores=25)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"].startswith("ses_") and body["cluster"] == cluster.public_id
    assert body["url"] == f"https://lab-c1.gshare.localhost/s/{body['id']}/"
    (gss,) = emulated.objects_of(*GSS)
    assert gss["metadata"]["name"] == body["id"].replace("_", "-")
    assert gss["metadata"]["namespace"] == "gshare-sessions"
    assert gss["spec"]["gpuMemoryMiB"] == 4096 and gss["spec"]["gpuCores"] == 25
    assert gss["spec"]["host"] == "lab-c1.gshare.localhost" and gss["spec"]["path"] == f"/s/{body['id']}/"
    assert gss["spec"]["authUrl"].endswith("/internal/connect/verify")
    shown = http.get(f"/api/v1/sessions/{body['id']}").json()
    assert shown["phase"] == "Starting" and shown["node"]


def test_url_is_on_the_pinned_clusters_own_hostname(http, live_cluster):
    live_cluster("lab-c1")
    other, _ = live_cluster("lab-c2")
    body = start(http, cluster="lab-c2").json()
    assert body["cluster"] == other.public_id
    assert body["url"].startswith("https://lab-c2.gshare.localhost/s/")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [({"gpus": 0}, "gpus"), ({"gpus": 17}, "gpus"), ({"gpu_cores": 101}, "gpu_cores"), ({"gpu_cores": 0}, "gpu_cores"),
     ({"gpu_memory_mib": -1}, "gpu_memory_mib"), ({"image": ""}, "image"), ({"image": "   "}, "image")],
)
def test_invalid_requests(http, live_cluster, extra, fragment):
    live_cluster("lab-c1")
    response = start(http, **extra)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert fragment in response.json()["detail"]
    assert Session.objects.count() == 0


@pytest.mark.parametrize("field", ["gpus", "gpu_memory_mib", "gpu_cores"])
@pytest.mark.parametrize("value", ["1", "25", True, False, 1.5, [1], 1.0, 1e3])
def test_numbers_must_be_json_numbers(http, live_cluster, field, value):
    live_cluster("lab-c1")
    response = start(http, **{field: value})
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request" and field in response.json()["errors"]
    assert Session.objects.count() == 0


def test_numbers_as_json_numbers_are_taken(http, live_cluster):
    live_cluster("lab-c1")
    response = start(http, gpus=1, gpu_memory_mib=4096, gpu_cores=25)
    assert response.status_code == 201, response.text
    assert (response.json()["gpus"], response.json()["gpu_memory_mib"], response.json()["gpu_cores"]) == (1, 4096, 25)


def test_no_capacity_says_what_is_short(http, live_cluster):
    live_cluster("lab-c1")
    total = fleet.expected_inventory("lab-c1")["gpus"]
    response = start(http, gpus=16)
    assert response.status_code == 409
    assert response.json()["code"] == "no_capacity"
    assert f"{total} healthy GPU(s)" in response.json()["detail"]


def test_unknown_and_unavailable_clusters(http, live_cluster):
    cluster, _ = live_cluster("lab-c1")
    assert start(http, cluster="clu_nothere").status_code == 404
    assert start(http, cluster="clu_nothere").json()["code"] == "cluster_not_found"
    Cluster.objects.filter(pk=cluster.pk).update(session_domain="")
    response = start(http, cluster=cluster.public_id)
    assert response.status_code == 409 and response.json()["code"] == "cluster_unavailable"
    assert "session_domain" in response.json()["detail"]
    Cluster.objects.filter(pk=cluster.pk).update(session_domain="x.example.com", status=Cluster.Status.UNREACHABLE)
    assert start(http, cluster="lab-c1").json()["code"] == "cluster_unavailable"


def test_users_see_their_own_staff_see_all(http, http_user, live_cluster):
    live_cluster("lab-c1")
    mine = start(http_user).json()["id"]
    staffs = start(http).json()["id"]
    assert [s["id"] for s in http_user.get("/api/v1/sessions").json()["results"]] == [mine]
    assert {s["id"] for s in http.get("/api/v1/sessions").json()["results"]} == {mine, staffs}
    assert http_user.get(f"/api/v1/sessions/{staffs}").status_code == 404
    assert http_user.delete(f"/api/v1/sessions/{staffs}").status_code == 404
    assert http_user.post(f"/api/v1/sessions/{staffs}/connect").status_code == 404
    filtered = http.get("/api/v1/sessions?cluster=lab-c1&phase=Starting").json()
    assert filtered["count"] == 2
    assert http.get("/api/v1/sessions?phase=Running").json()["count"] == 0


@pytest.mark.django_db(transaction=True)
def test_delete_stops_and_is_idempotent(http, live_cluster):
    _, emulated = live_cluster("lab-c1")
    session_id = start(http).json()["id"]
    response = http.delete(f"/api/v1/sessions/{session_id}")
    assert response.status_code == 202
    assert response.json()["phase"] == "Terminated"
    assert emulated.objects_of(*GSS) == []
    assert Allocation.objects.count() == 0
    again = http.delete(f"/api/v1/sessions/{session_id}")
    assert again.status_code == 202 and again.json()["phase"] == "Terminated"


def test_connect_link_carries_a_short_lived_token(http, live_cluster):
    live_cluster("lab-c1")
    session_id = start(http).json()["id"]
    url = http.post(f"/api/v1/sessions/{session_id}/connect").json()["url"]
    assert url.startswith(f"https://lab-c1.gshare.localhost/s/{session_id}/?token=")
    import jwt

    claims = jwt.decode(url.split("token=")[1], options={"verify_signature": False})
    assert claims["aud"] == "gshare-connect" and claims["sid"] == session_id
    assert claims["exp"] - claims["iat"] <= 600


def test_deregistration_is_refused_while_sessions_live(http, live_cluster):
    cluster, _ = live_cluster("lab-c1")
    session_id = start(http).json()["id"]
    response = http.delete(f"/api/v1/clusters/{cluster.public_id}")
    assert response.status_code == 409 and response.json()["code"] == "cluster_busy"
    http.delete(f"/api/v1/sessions/{session_id}")
    assert http.delete(f"/api/v1/clusters/{cluster.public_id}").json()["status"] == "deregistered"
    # history stays readable
    assert http.get(f"/api/v1/sessions/{session_id}").json()["cluster"] == cluster.public_id


def test_missing_crd_fails_the_session_with_the_cause(http, fleet_cluster):
    objects = [o for o in fleet.cluster_objects("lab-c1") if o["kind"] != "CustomResourceDefinition"]
    emulated = fleet_cluster("lab-c1", objects=objects)
    from tests.helpers import kubeconfig_text

    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain="a.example.com")
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory("lab-c1")["snapshot"]["nodes"])
    body = start(http).json()
    shown = http.get(f"/api/v1/sessions/{body['id']}").json()
    assert shown["phase"] == "Failed"
    assert "CRD" in shown["message"] and "charts/gshare-operator" in shown["message"]
    assert Allocation.objects.count() == 0
