"""End to end: a session through the API, its GShareSession on the emulated cluster, the real operator
(Kopf) making Pod/Service/Ingress, the emulator's HAMi stand-in running the pod, status back to the
control plane, and a stop that deletes everything."""

import pytest

from tests.helpers import registered, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def test_session_runs_on_its_cluster_and_stops(http, fleet_cluster, operator_process, tmp_path, settings, live_server):
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1", pod_startup_seconds=0.2)
    operator_process(cluster, kubeconfig_path, token_path)
    wait_for(lambda: http.get(f"/api/v1/gpus?cluster={cluster.public_id}").json()["count"] > 0, what="inventory")

    created = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, "gpu_memory_mib": 4096, "gpu_cores": 25})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    assert created.json()["url"] == f"https://lab-c1.example.com/s/{session_id}/"

    running = wait_for(
        lambda: (body := http.get(f"/api/v1/sessions/{session_id}").json())["phase"] == "Running" and body, what="Running", timeout=60
    )
    node_gpus = {g["uuid"] for g in http.get(f"/api/v1/gpus?cluster={cluster.public_id}&limit=500").json()["results"] if g["node"] == running["node"]}
    assert running["devices"] and set(running["devices"]) <= node_gpus  # from HAMi's pod allocation annotation

    name = session_id.replace("_", "-")
    (pod,) = [p for p in emulated.objects_of("pods") if p["metadata"]["name"] == name]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["nvidia.com/gpumem"], limits["nvidia.com/gpucores"]) == ("1", "4096", "25")
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    (ingress,) = [i for i in emulated.objects_of("ingresses", "networking.k8s.io", "v1") if i["metadata"]["name"] == name]
    assert ingress["spec"]["rules"][0]["host"] == "lab-c1.example.com"
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"] == f"{live_server.url}/internal/connect/verify"

    assert http.delete(f"/api/v1/sessions/{session_id}").status_code == 202
    wait_for(lambda: http.get(f"/api/v1/sessions/{session_id}").json()["phase"] == "Terminated", what="Terminated")
    wait_for(lambda: not [p for p in emulated.objects_of("pods") if p["metadata"]["name"] == name], what="pod deleted (owner cascade)")
