"""``kube.KubeGateway`` over HTTP: against the emulator, a listener that never answers, and a server that
answers one fixed status with a Kubernetes ``Status`` body."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from kube import Deadline, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import NAMESPACES, NODES, SECRETS, Resource
from tests.helpers import silent_kubeconfig, status_body


def gateway_for(emulated, **budget) -> KubeGateway:
    return KubeGateway.for_kubeconfig(emulated.kubeconfig("lab"), **(budget or {"call_timeout": 5}))


@pytest.fixture
def fixed_status(hostile):
    """Factory: a loopback server answering every request with ``status`` and a Status body naming ``message``."""

    def start(status: int, message: str = "the answer") -> str:
        return hostile(status, status_body(message, status), headers={"Content-Type": "application/json"})[0]

    return start


def test_apply_creates_then_updates_and_reads_back(fleet_cluster):
    emulated = fleet_cluster()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}, "data": {"k": "dg=="}}
    with gateway_for(emulated) as kube:
        kube.apply(secret)
        kube.apply({**secret, "data": {"k": "dw=="}})
        read = kube.get(SECRETS, "s", namespace="default")
        assert read["data"]["k"] == "dw=="
        managers = {entry.get("manager") for entry in read["metadata"].get("managedFields") or []}
        assert not managers or "gshare-control-plane" in managers
        assert "s" in {item["metadata"]["name"] for item in kube.list(SECRETS, namespace="default")}


def test_delete_counts_a_404_as_done_and_get_can_allow_it(fleet_cluster):
    emulated = fleet_cluster()
    with gateway_for(emulated) as kube:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})
        assert kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}}, exists_ok=True) is None
        assert kube.delete(NAMESPACES, "scratch") is True
        assert kube.delete(NAMESPACES, "scratch") is False
        assert kube.get(NAMESPACES, "scratch", missing_ok=True) is None
        with pytest.raises(KubeRefused) as refused:
            kube.get(NAMESPACES, "scratch")
    assert refused.value.status == 404


def test_typed_reads_list_by_label(fleet_cluster):
    emulated = fleet_cluster()
    with gateway_for(emulated) as kube:
        assert kube.version()["gitVersion"].startswith("v1.")
        gpu = kube.list(NODES, label_selector="gpu=on")
        assert gpu and all(node["metadata"]["labels"]["gpu"] == "on" for node in gpu)


def test_a_silent_apiserver_is_unavailable_within_the_shared_budget(silent_listener):
    deadline = Deadline(0.5)
    kube = KubeGateway.for_kubeconfig(silent_kubeconfig(silent_listener), deadline=deadline)
    with kube, pytest.raises(KubeUnavailable) as unavailable:
        kube.get(NAMESPACES, "kube-system")
    # cut off by the shared budget itself (not by a longer socket timeout or the peer), which is now spent
    assert unavailable.value.deadline_exceeded and unavailable.value.status is None
    assert str(unavailable.value) == "did not answer (DeadlineExceeded)"
    assert unavailable.value.cause.seconds == 0.5 and deadline.remaining() == 0
    with pytest.raises(KubeUnavailable) as again:  # the budget is spent: the next call is refused at once
        kube.version()
    assert again.value.deadline_exceeded


@pytest.mark.parametrize("status", [500, 503, 429])
def test_overload_and_server_errors_are_unavailable(fixed_status, status):
    host_port = fixed_status(status, "etcd is slow")
    with KubeGateway.for_kubeconfig(silent_kubeconfig(host_port), call_timeout=5) as kube, pytest.raises(KubeUnavailable) as info:
        kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}})
    assert info.value.status == status and info.value.message == "etcd is slow"
    assert str(info.value).startswith(f"answered {status} (")


@pytest.mark.parametrize(("status", "reason"), [(403, "Forbidden"), (422, "Unprocessable Entity")])
def test_a_refusal_carries_status_reason_and_the_apiservers_message(fixed_status, status, reason):
    host_port = fixed_status(status, 'secrets "s" is forbidden: User "u" cannot patch resource "secrets"')
    with KubeGateway.for_kubeconfig(silent_kubeconfig(host_port), call_timeout=5) as kube, pytest.raises(KubeRefused) as info:
        kube.delete(SECRETS, "s", namespace="default")
    refused = info.value
    assert (refused.status, refused.reason) == (status, reason)
    assert refused.message == 'secrets "s" is forbidden: User "u" cannot patch resource "secrets"'
    assert refused.summary == f"{reason}: {refused.message}"
    assert str(refused) == f"{status} {reason}: {refused.message}"
    assert not refused.unreadable


def test_an_answer_that_is_not_json_is_a_refusal_marked_unreadable(settings):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host_port = f"127.0.0.1:{server.server_address[1]}"
    settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, host_port]
    try:
        with KubeGateway.for_kubeconfig(silent_kubeconfig(host_port), call_timeout=5) as kube, pytest.raises(KubeRefused) as info:
            kube.version()
        assert info.value.unreadable
    finally:
        server.shutdown()
        server.server_close()


def test_paths_of_core_group_and_cluster_scoped_kinds():
    assert SECRETS.path(namespace="a b", name="s") == "/api/v1/namespaces/a%20b/secrets/s"
    assert NODES.path(name="n1") == "/api/v1/nodes/n1"
    assert Resource("storage.k8s.io/v1", "csistoragecapacities", True).path() == "/apis/storage.k8s.io/v1/csistoragecapacities"


def test_a_kubeconfig_from_the_cluster_row(fleet_cluster):
    from tests.factories import ClusterFactory

    emulated = fleet_cluster()
    cluster = ClusterFactory.build(kubeconfig=yaml.safe_dump(emulated.kubeconfig("lab")), apiserver_url=emulated.url)
    with KubeGateway.for_cluster(cluster, call_timeout=5) as kube:
        assert kube.server == emulated.url
        assert kube.get(NAMESPACES, "kube-system")["metadata"]["uid"]
