"""Every audited action through its real interface (HTTP, the console, a command, a beat task, the operator API), and
its row: actor, action, object, changed fields, source address for HTTP.

Clusters are emulated apiservers of the demo fleet (``fleet_cluster``), registered through ``POST /api/v1/clusters``
or the service; beat tasks are sent the way django-celery-beat sends them (its ``ModelEntry`` options: the
``periodic_task_name`` header).
"""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from django_celery_beat.schedulers import ModelEntry

from audit.models import AuditRecord
from billing.models import CreditAccount, LedgerEntry, Policy, Price
from billing.services import account_for, ledger_append
from clusters.models import Cluster
from gshare.celery import app as celery_app
from identity.keys import signing_key_ensure
from identity.models import ApiToken, SigningKey
from sessions.models import Session
from storage.models import Volume
from tests.helpers import Http, kubeconfig_text, wait_for

pytestmark = pytest.mark.django_db

#: The idle policy fields of the policy form, at their defaults.
IDLE = {"idle_timeout_minutes": "60", "idle_warning_minutes": "15", "max_runtime_hours": "24", "runtime_warning_minutes": "15"}

A = AuditRecord.Action


def rows(action: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=action).order_by("id"))


def one(action: str) -> AuditRecord:
    found = rows(action)
    assert len(found) == 1, [(r.actor, r.object_id) for r in found]
    return found[0]


def beat(task_name: str) -> None:
    """Send ``task_name`` the way celery beat with django-celery-beat's scheduler does (eager here)."""
    celery_app.loader.import_default_modules()  # the worker's autodiscovery of every app's tasks
    every, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    model, _ = PeriodicTask.objects.get_or_create(name=f"test {task_name}", defaults={"task": task_name, "interval": every})
    entry = ModelEntry(model, app=celery_app)
    celery_app.tasks[entry.task].apply_async(entry.args, entry.kwargs, **entry.options)


def register(http, emulated, name: str = "lab-c1") -> str:
    response = http.post("/api/v1/clusters", json={"name": name, "kubeconfig": kubeconfig_text(emulated),
                                                   "session_domain": f"{name}.gshare.localhost"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


# --------------------------------------------------------------------------- clusters


def test_cluster_register_update_deregister_over_http(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated)
    row = one(A.CLUSTER_REGISTER)
    assert (row.actor, row.object_type, row.object_id, row.object_repr) == ("api:admin", "cluster", cluster_id, "lab-c1")
    assert (row.cluster, row.cluster_name, row.source_address) == (cluster_id, "lab-c1", "127.0.0.1")
    assert row.changes["kubeconfig"] == {"secret": True}
    assert row.changes["session_domain"] == {"old": None, "new": "lab-c1.gshare.localhost"}
    assert row.changes["apiserver_url"]["new"] == emulated.url and row.details["kube_system_uid"]

    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"session_domain": "c1.example.org", "kubeconfig": kubeconfig_text(emulated)})
    assert response.status_code == 200, response.text
    row = one(A.CLUSTER_UPDATE)
    assert (row.actor, row.object_id, row.source_address) == ("api:admin", cluster_id, "127.0.0.1")
    assert row.changes == {"kubeconfig": {"secret": True}, "session_domain": {"old": "lab-c1.gshare.localhost", "new": "c1.example.org"}}
    assert row.details["apiserver_url"] == emulated.url

    assert http.delete(f"/api/v1/clusters/{cluster_id}").status_code == 200
    row = one(A.CLUSTER_DEREGISTER)
    assert (row.actor, row.object_id, row.source_address) == ("api:admin", cluster_id, "127.0.0.1")
    assert row.changes == {"status": {"old": "pending", "new": "deregistered"}} and row.details == {"generation": 2}


def test_a_refused_change_writes_no_row(http, fleet_cluster):
    lab_c1, lab_c2 = fleet_cluster("lab-c1"), fleet_cluster("lab-c2")
    cluster_id = register(http, lab_c1)
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(lab_c2)})
    assert response.json()["code"] == "different_cluster"
    assert rows(A.CLUSTER_UPDATE) == []


def test_console_edits_and_actions_are_audited_as_the_staff_user(http, fleet_cluster, console):
    cluster_id = register(http, fleet_cluster("lab-c1"))
    cluster = Cluster.objects.get(public_id=cluster_id)
    form = {"session_domain": "console.example.org", "ingress_node": "cp-1", "volume_storage_class": "",
            "routing": "ingress-nginx", "gateway_name": "gshare-sessions", "gateway_namespace": "gshare-system"}
    assert console.post(f"/clusters/cluster/{cluster.pk}/change/", form).status_code == 302
    row = one(A.CLUSTER_UPDATE)
    assert (row.actor, row.source_address) == ("console:admin", "127.0.0.1")
    assert row.changes == {"ingress_node": {"old": "", "new": "cp-1"},
                           "session_domain": {"old": "lab-c1.gshare.localhost", "new": "console.example.org"}}

    console.post("/clusters/cluster/", {"action": "revoke_operator_tokens", "_selected_action": [cluster.pk]})
    row = one(A.OPERATOR_TOKENS_REVOKE)
    assert (row.actor, row.object_id, row.source_address, row.details) == ("console:admin", cluster_id, "127.0.0.1", {"generation": 2})


# --------------------------------------------------------------------------- operator tokens


def signed(cluster: Cluster, *, iat: float, exp: float) -> str:
    key = signing_key_ensure()
    payload = {"iss": "gshare-control-plane", "sub": f"operator:{cluster.public_id}", "aud": "gshare-internal", "iat": int(iat),
               "nbf": int(iat), "exp": int(exp), "jti": "old-jti-0001", "gen": cluster.credential_generation}
    return jwt.encode(payload, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid})


@pytest.mark.django_db(transaction=True)
def test_operator_tokens_mint_rotate_revoke_by_command_exchange_by_the_operator_and_rotate_by_beat(http, fleet_cluster, live_server, settings):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated)
    cluster = Cluster.objects.get(public_id=cluster_id)

    out = StringIO()
    call_command("mint_operator_token", cluster_id, stdout=out)
    row = one(A.OPERATOR_TOKEN_MINT)
    token = out.getvalue().strip()
    assert (row.actor, row.object_type, row.object_id, row.cluster) == ("command:mint_operator_token", "operator_token",
                                                                         jwt.decode(token, options={"verify_signature": False})["jti"], cluster_id)
    assert row.details["generation"] == 1 and row.source_address is None

    call_command("rotate_operator_tokens", "--cluster", cluster_id, stdout=StringIO())
    row = one(A.OPERATOR_TOKEN_ROTATE)
    assert (row.actor, row.cluster, row.details["secret_action"]) == ("command:rotate_operator_tokens", cluster_id, "created")

    call_command("revoke_operator_tokens", cluster_id, stdout=StringIO())
    row = one(A.OPERATOR_TOKENS_REVOKE)
    assert (row.actor, row.object_id, row.details) == ("command:revoke_operator_tokens", cluster_id, {"generation": 2})

    cluster.refresh_from_db()
    now = time.time()
    old = signed(cluster, iat=now - 3000, exp=now + 600)
    response = Http(live_server.url, old).post("/internal/v1/token")
    assert response.status_code == 200, response.text
    row = one(A.OPERATOR_TOKEN_EXCHANGE)
    new_jti = jwt.decode(response.json()["token"], options={"verify_signature": False})["jti"]
    assert (row.actor, row.object_id, row.cluster, row.source_address) == (f"operator:{cluster_id}", new_jti, cluster_id, "127.0.0.1")
    assert (row.details["old_jti"], row.details["new_jti"], row.details["generation"]) == ("old-jti-0001", new_jti, 2)

    Cluster.objects.filter(pk=cluster.pk).update(operator_token_rotation_error="failed before")  # due again
    beat("clusters.rotate_operator_tokens")
    assert [r.actor for r in rows(A.OPERATOR_TOKEN_ROTATE)] == ["command:rotate_operator_tokens", "beat:clusters.rotate_operator_tokens"]


# --------------------------------------------------------------------------- signing keys and API tokens


@pytest.mark.django_db(transaction=True)
def test_signing_keys_rotate_import_by_command_and_retire_by_beat(tmp_path):
    first = signing_key_ensure()
    call_command("rotate_signing_key", stdout=StringIO())
    rotated = [r for r in rows(A.SIGNING_KEY_ROTATE) if r.actor == "command:rotate_signing_key"]
    assert len(rotated) == 1 and rotated[0].details["replaced"] == [first.kid]
    second = SigningKey.objects.get(status=SigningKey.Status.ACTIVE)
    assert (rotated[0].object_type, rotated[0].object_id, rotated[0].changes) == ("signing_key", second.kid, {"status": {"old": None, "new": "active"}})

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "signing-key.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    call_command("import_signing_key", "--file", str(path), stdout=StringIO())
    row = one(A.SIGNING_KEY_IMPORT)
    assert (row.actor, row.details["replaced"], row.details["bits"]) == ("command:import_signing_key", [second.kid], 2048)
    call_command("import_signing_key", "--file", str(path), stdout=StringIO())  # already on record: nothing changes, no row
    assert len(rows(A.SIGNING_KEY_IMPORT)) == 1

    SigningKey.objects.filter(kid__in=[first.kid, second.kid]).update(retire_after=timezone.now() - timedelta(seconds=1))
    beat("gshare.signing_keys_retire")
    retired = rows(A.SIGNING_KEY_RETIRE)
    assert {r.object_id for r in retired} == {first.kid, second.kid}
    assert {r.actor for r in retired} == {"beat:gshare.signing_keys_retire"}
    assert retired[0].changes == {"status": {"old": "published", "new": "retired"}}


def test_api_tokens_created_by_command_and_revoked_in_the_console(staff_user, console):
    call_command("create_api_token", "admin", "--name", "laptop", stdout=StringIO())
    token = ApiToken.objects.get(name="laptop")
    row = [r for r in rows(A.API_TOKEN_CREATE) if r.object_id == token.key_id][0]
    assert (row.actor, row.object_type, row.object_repr, row.details) == ("command:create_api_token", "api_token", "admin/laptop",
                                                                          {"user": "admin", "name": "laptop"})
    console.post("/gshare/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    row = one(A.API_TOKEN_REVOKE)
    assert (row.actor, row.object_id, row.source_address) == ("console:admin", token.key_id, "127.0.0.1")
    assert row.changes["revoked_at"]["old"] is None and row.changes["revoked_at"]["new"]


# --------------------------------------------------------------------------- sessions


@pytest.mark.django_db(transaction=True)
def test_sessions_created_and_stopped_by_the_owner_staff_the_console_and_the_overdraft_stopper(
    live_cluster, live_server, plain_user, http, http_user, console, settings,
):
    cluster, _ = live_cluster("lab-c1")
    body = {"image": "quay.io/jupyter/base-notebook", "gpus": 1, "gpu_memory_mib": 1000, "gpu_cores": 10}
    ids = []
    for _ in range(4):
        response = http_user.post("/api/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    created = rows(A.SESSION_CREATE)
    assert [r.object_id for r in created] == ids
    assert {(r.actor, r.cluster, r.cluster_name, r.source_address) for r in created} == {("api:alice", cluster.public_id, "lab-c1", "127.0.0.1")}
    assert created[0].changes["gpus"] == {"old": None, "new": 1} and created[0].details == {"owner": "alice"}

    assert http_user.delete(f"/api/v1/sessions/{ids[0]}").status_code == 202  # the owner
    assert http.delete(f"/api/v1/sessions/{ids[1]}").status_code == 202  # staff
    console.post("/gpu_sessions/session/", {"action": "stop", "_selected_action": [Session.objects.get(public_id=ids[2]).pk],
                                                "post": "yes"})  # the confirmation answered
    settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS = 0
    ledger_append(account=account_for(plain_user), kind=LedgerEntry.Kind.ADJUSTMENT, amount=Decimal("-1"), idempotency_key="debt")
    CreditAccount.objects.filter(user=plain_user).update(below_zero_since=timezone.now() - timedelta(seconds=5))
    beat("billing.stop_overdrawn_sessions")
    stopped = {r.object_id: r for r in rows(A.SESSION_STOP)}
    assert {sid: stopped[sid].actor for sid in ids} == {
        ids[0]: "api:alice", ids[1]: "api:admin", ids[2]: "console:admin", ids[3]: "beat:billing.stop_overdrawn_sessions",
    }
    assert stopped[ids[0]].source_address == "127.0.0.1" and stopped[ids[3]].source_address is None
    assert stopped[ids[0]].changes["phase"]["new"] == "Stopping" and stopped[ids[0]].details["owner"] == "alice"
    assert stopped[ids[3]].details["reason"].startswith("Stopped: credits ran out")


# --------------------------------------------------------------------------- billing


def test_grants_over_http_prices_and_policies_in_the_console(http, plain_user, console, live_cluster):
    response = http.post("/api/v1/billing/grants", json={"user": "alice", "amount": "25.5", "reason": "welcome"},
                         headers={"Idempotency-Key": "grant-0001"})
    assert response.status_code == 201, response.text
    http.post("/api/v1/billing/grants", json={"user": "alice", "amount": "25.5", "reason": "welcome"}, headers={"Idempotency-Key": "grant-0001"})
    row = one(A.CREDIT_GRANT)  # the retry changed nothing: no second row
    assert (row.actor, row.object_type, row.source_address) == ("api:admin", "ledger_entry", "127.0.0.1")
    assert row.changes == {"balance": {"old": "0.000000", "new": "25.500000"}}
    assert (row.details["user"], row.details["amount"], row.details["reason"]) == ("alice", "25.500000", "welcome")

    assert console.post("/billing/price/add/", {"gpu_model": "NVIDIA H100 80GB HBM3", "credits_per_gpu_hour": "2.5"}).status_code == 302
    price = Price.objects.get(gpu_model="NVIDIA H100 80GB HBM3")
    assert console.post(f"/billing/price/{price.pk}/change/", {"credits_per_gpu_hour": "3"}).status_code == 302
    assert console.post(f"/billing/price/{price.pk}/delete/", {"post": "yes"}).status_code == 302
    made, changed, deleted = one(A.PRICE_CREATE), one(A.PRICE_UPDATE), one(A.PRICE_DELETE)
    assert {r.actor for r in (made, changed, deleted)} == {"console:admin"} and made.source_address == "127.0.0.1"
    assert made.object_repr == "NVIDIA H100 80GB HBM3" and made.changes == {"credits_per_gpu_hour": {"old": None, "new": "2.500000"}}
    assert changed.changes == {"credits_per_gpu_hour": {"old": "2.500000", "new": "3.000000"}}
    assert deleted.changes == {"credits_per_gpu_hour": {"old": "3.000000", "new": None}}

    cluster, _ = live_cluster("lab-c1")
    form = {"user": plain_user.pk, "max_sessions": "2", "max_gpus": "", "min_balance_hours": "1", "grace_seconds": "900", **IDLE}
    assert console.post("/billing/policy/add/", form).status_code == 302
    policy = Policy.objects.get(user=plain_user)
    assert console.post(f"/billing/policy/{policy.pk}/change/", {**form, "max_sessions": "3", "allowed_clusters": [cluster.pk]}).status_code == 302
    assert console.post(f"/billing/policy/{policy.pk}/delete/", {"post": "yes"}).status_code == 302
    made, changed, deleted = one(A.POLICY_CREATE), one(A.POLICY_UPDATE), one(A.POLICY_DELETE)
    assert {r.actor for r in (made, changed, deleted)} == {"console:admin"} and made.object_repr == "policy of alice"
    assert made.changes["max_sessions"] == {"old": None, "new": 2}
    assert changed.changes == {"max_sessions": {"old": 2, "new": 3}, "allowed_clusters": {"old": [], "new": [cluster.public_id]}}
    assert deleted.changes["max_sessions"] == {"old": 3, "new": None}


# --------------------------------------------------------------------------- storage


def test_pools_and_volumes_over_http(http, http_user, live_cluster):
    cluster, _ = live_cluster("lab-c1")
    response = http.post("/api/v1/storage/pools", json={"name": "lab-nfs", "cluster": cluster.public_id, "storage_class": "gshare-nfs",
                                                         "manual_capacity_gb": 100})
    assert response.status_code == 201, response.text
    pool_id = response.json()["id"]
    row = one(A.POOL_CREATE)
    assert (row.actor, row.object_type, row.object_id, row.cluster, row.source_address) == ("api:admin", "storage_pool", pool_id,
                                                                                            cluster.public_id, "127.0.0.1")
    assert row.changes["storage_class"] == {"old": None, "new": "gshare-nfs"} and row.changes["cluster"]["new"] == cluster.public_id
    assert http.patch(f"/api/v1/storage/pools/{pool_id}", json={"manual_capacity_gb": 200}).status_code == 200
    assert one(A.POOL_UPDATE).changes == {"manual_capacity_gb": {"old": 100, "new": 200}}

    response = http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10})
    assert response.status_code == 201, response.text
    volume_id = response.json()["id"]
    row = one(A.VOLUME_CREATE)
    assert (row.actor, row.object_type, row.object_id, row.object_repr) == ("api:alice", "volume", volume_id, "datasets")
    assert row.changes["quota_gb"] == {"old": None, "new": 10} and row.changes["pool"]["new"] == pool_id and row.details == {"owner": "alice"}
    assert http_user.patch(f"/api/v1/storage/volumes/{volume_id}", json={"quota_gb": 20}).status_code == 200
    assert one(A.VOLUME_UPDATE).changes == {"quota_gb": {"old": 10, "new": 20}}
    assert http_user.delete(f"/api/v1/storage/volumes/{volume_id}").status_code in (200, 204)
    row = one(A.VOLUME_DELETE)
    assert (row.actor, row.changes["status"]["new"]) == ("api:alice", "deleted")

    # A pool is deleted once the storage its deleted volumes held is charged (billing.storage_charges): close the
    # periods as the beat task would a day later.
    from billing import storage_charges

    assert http.delete(f"/api/v1/storage/pools/{pool_id}").json()["code"] == "pool_in_use"
    storage_charges.storage_charges_close(now=timezone.now() + timedelta(days=1))
    assert http.delete(f"/api/v1/storage/pools/{pool_id}").status_code == 204
    row = one(A.POOL_DELETE)
    assert (row.actor, row.object_id, row.cluster, row.changes["name"]) == ("api:admin", pool_id, cluster.public_id, {"old": "lab-nfs", "new": None})


@pytest.mark.django_db(transaction=True)
def test_a_volume_move_over_http(http_user, plain_user, fleet_cluster, settings):
    from tests.storage.test_move import CSI, make_volume, seed_bound_claim

    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    from clusters import services as cluster_services

    (a, emulated_a), (b, _) = [
        (cluster_services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.gshare.localhost"), emulated)
        for name, emulated in (("lab-c1", fleet_cluster("lab-c1")), ("lab-c2", fleet_cluster("lab-c2")))
    ]
    volume = make_volume(plain_user, a)
    seed_bound_claim(emulated_a, volume, source={"csi": CSI})
    response = http_user.post(f"/api/v1/storage/volumes/{volume.public_id}/move", json={"cluster": b.public_id})
    assert response.status_code == 200, response.text
    row = one(A.VOLUME_MOVE)
    assert (row.actor, row.object_id, row.cluster, row.source_address) == ("api:alice", volume.public_id, b.public_id, "127.0.0.1")
    assert row.changes == {"cluster": {"old": a.public_id, "new": b.public_id}}
    assert row.details["pv_name"] == Volume.objects.get(pk=volume.pk).pv_name


# --------------------------------------------------------------------------- a real worker


@pytest.fixture
def worker():
    """A real Celery worker (a thread of this process, solo pool) on the test's Redis; tasks are published, not eager."""
    from celery.contrib.testing.worker import start_worker

    celery_app.loader.import_default_modules()
    eager, celery_app.conf.task_always_eager = celery_app.conf.task_always_eager, False
    celery_app.control.purge()
    try:
        with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield
    finally:
        celery_app.conf.task_always_eager = eager
        # The worker's pool marks the whole process as one where joining a result blocks, and nothing unmarks it:
        # later tests' eager tasks (a task that runs another) would then refuse with "Never call result.get()".
        from celery.result import _set_task_join_will_block

        _set_task_join_will_block(False)


def rows_once(action: str, count: int, timeout: float = 30) -> list[AuditRecord]:
    """The audit rows of ``action`` once there are at least ``count`` (``count`` >= 1); AssertionError after ``timeout`` s."""
    return wait_for(lambda: len(found := rows(action)) >= count and found, timeout, what=f"{count} {action} row(s)", interval=0.2)


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_a_queued_task_as_whoever_queued_it_and_a_beat_task_as_beat(http, fleet_cluster, worker):
    from audit.context import actor_scope
    from clusters.tasks import retry_operator_token_push

    cluster_id = register(http, fleet_cluster("lab-c1"))
    Cluster.objects.filter(public_id=cluster_id).update(operator_token_rotation_error="failed before")
    with actor_scope("console:admin"):
        retry_operator_token_push.delay(cluster_id)  # as the console's "rotate" retry would be queued
    assert [r.actor for r in rows_once(A.OPERATOR_TOKEN_ROTATE, 1)] == ["console:admin"]

    Cluster.objects.filter(public_id=cluster_id).update(operator_token_rotation_error="failed again")
    beat("clusters.rotate_operator_tokens")
    assert [r.actor for r in rows_once(A.OPERATOR_TOKEN_ROTATE, 2)] == ["console:admin", "beat:clusters.rotate_operator_tokens"]

    retry_operator_token_push.delay(cluster_id)  # queued with no actor: nothing to retry, and no row
    Cluster.objects.filter(public_id=cluster_id).update(operator_token_rotation_error="failed a third time")
    retry_operator_token_push.delay(cluster_id)
    assert [r.actor for r in rows_once(A.OPERATOR_TOKEN_ROTATE, 3)][2] == "system"
