"""A stop that races an apply leaves no GShareSession on the cluster.

Through HTTP on the live server, against the emulated lab-c1 behind a loopback proxy that holds the GShareSession
PATCH (the apply) for a few seconds: ``DELETE /api/v1/sessions/{id}`` arrives while the PATCH is in flight, its
delete finds nothing (404) and the session is Terminated; then the PATCH lands and creates the object. The apply
must delete it again, or, when that delete fails, ``sessions.reconcile`` must.
"""

import socket
import threading
from datetime import timedelta

import pytest
import yaml
from django.db import connections
from django.utils import timezone

import contract
from clusters import services as cluster_services
from demo import fleet
from sessions import lifecycle, tasks
from sessions.models import Session

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")
HOLD = 4.0  # seconds the proxy holds the GShareSession PATCH
METHODS = (b"GET ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ", b"HEAD ", b"OPTIONS ")


class HoldingProxy:
    """A loopback TCP proxy to an emulated apiserver that holds the GShareSession PATCH for ``HOLD`` seconds.

    ``patch_seen`` is set when the PATCH arrives, ``patch_sent`` once it was forwarded; while ``refuse_deletes``
    is set (``refuse_deletes_after_patch``: from the moment the PATCH is forwarded), a DELETE of a GShareSession is
    answered by closing the connection (an apiserver that does not answer).
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.patch_seen, self.patch_sent, self.refuse_deletes = threading.Event(), threading.Event(), threading.Event()
        self.refuse_deletes_after_patch = False
        self.server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, inspect: bool) -> None:
        try:
            while data := source.recv(65536):
                line = data.split(b"\r\n", 1)[0]
                if inspect and data.startswith(METHODS) and b"gsharesessions" in line:
                    if data.startswith(b"PATCH "):
                        self.patch_seen.set()
                        threading.Event().wait(HOLD)
                        if self.refuse_deletes_after_patch:
                            self.refuse_deletes.set()
                    elif data.startswith(b"DELETE ") and self.refuse_deletes.is_set():
                        return
                sink.sendall(data)
                if inspect and data.startswith(b"PATCH ") and b"gsharesessions" in line:
                    self.patch_sent.set()
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def held_cluster(fleet_cluster, settings):
    """lab-c1 registered through the proxy (``(emulated, proxy)``), connected and inventoried."""
    settings.GSHARE_PROBE_TIMEOUT = 15.0
    emulated = fleet_cluster("lab-c1")
    proxy = HoldingProxy(int(emulated.url.rsplit(":", 1)[1]))
    settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, proxy.host]
    kubeconfig = emulated.kubeconfig("lab")
    kubeconfig["clusters"][0]["cluster"]["server"] = f"http://{proxy.host}"
    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=yaml.safe_dump(kubeconfig), session_domain="lab-c1.gshare.localhost")
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory("lab-c1")["snapshot"]["nodes"])
    yield emulated, proxy
    proxy.close()


def stop_during_apply(http, proxy: HoldingProxy) -> Session:
    """Create a session (its apply is held by the proxy), stop it while the PATCH is in flight; return it once both answered."""
    answers = {}

    def create():
        answers["create"] = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1}, timeout=60)
        connections.close_all()

    creating = threading.Thread(target=create)
    creating.start()
    assert proxy.patch_seen.wait(30), "the apply's PATCH never reached the cluster"
    session = Session.objects.get()
    assert session.phase == Session.Phase.SCHEDULED
    stopped = http.delete(f"/api/v1/sessions/{session.public_id}", timeout=30)
    assert stopped.status_code == 202, stopped.text
    assert not proxy.patch_sent.is_set(), f"the PATCH was forwarded before the stop finished (HOLD {HOLD} s too short here)"
    assert Session.objects.get().phase == Session.Phase.TERMINATED  # the stop's delete found nothing (404) and was done
    creating.join(60)
    assert proxy.patch_sent.is_set() and answers["create"].status_code == 201, answers["create"].text
    session.refresh_from_db()
    return session


@pytest.mark.django_db(transaction=True)
def test_a_stop_during_the_apply_leaves_no_object_on_the_cluster(http, held_cluster):
    emulated, proxy = held_cluster
    session = stop_during_apply(http, proxy)
    assert session.phase == Session.Phase.TERMINATED
    assert emulated.objects_of(*GSS) == [], "the apply re-created the GShareSession of a Terminated session"
    assert http.get(f"/api/v1/sessions/{session.public_id}").json()["phase"] == "Terminated"
    assert not session.allocations.exists()


@pytest.mark.django_db(transaction=True)
def test_when_the_apply_cannot_delete_it_the_reconciler_does(http, held_cluster):
    emulated, proxy = held_cluster
    proxy.refuse_deletes_after_patch = True  # the stop's delete gets its 404, the apply's delete again fails
    session = stop_during_apply(http, proxy)
    assert session.phase == Session.Phase.TERMINATED
    names = [o["metadata"]["name"] for o in emulated.objects_of(*GSS)]
    assert names == [contract.session_object_name(session.public_id)]  # what the late PATCH created is still there
    proxy.refuse_deletes.clear()  # the apiserver answers again

    assert tasks.sessions_reconcile_task.delay().get()["delete"] == 0  # ended just now: not due yet
    Session.objects.filter(pk=session.pk).update(ended_at=timezone.now() - timedelta(seconds=120))
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 1, "reapply": 0, "unpublished": 0}
    assert emulated.objects_of(*GSS) == []
    assert http.get(f"/api/v1/sessions/{session.public_id}").json()["phase"] == "Terminated"

    # Deleting again stops once the window has passed: a run after that publishes nothing for it.
    Session.objects.filter(pk=session.pk).update(ended_at=timezone.now() - lifecycle.REDELETE_WINDOW - timedelta(seconds=120))
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 0}
