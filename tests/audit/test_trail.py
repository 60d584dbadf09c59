"""The audit trail itself: append-only (in PostgreSQL and in Python), the secret filter, the actor context, the
staff API (filters, 403, 400, paging, query count) and the read-only console page."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import context, services
from audit.models import AuditRecord, AuditRecordImmutable
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def record(**kwargs) -> AuditRecord:
    kwargs.setdefault("action", AuditRecord.Action.PRICE_UPDATE)
    kwargs.setdefault("object_type", "price")
    kwargs.setdefault("object_id", "1")
    return services.audit_record(**kwargs)


# --------------------------------------------------------------------------- append-only


def test_the_database_refuses_to_update_or_delete_a_row():
    row = record(changes={"credits_per_gpu_hour": ("1", "2")})
    for statement in ("UPDATE audit_auditrecord SET actor = 'someone-else' WHERE id = %s", "DELETE FROM audit_auditrecord WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [row.pk])
    assert AuditRecord.objects.get(pk=row.pk).actor == "system"


def test_the_model_refuses_too_before_the_database_does():
    row = record()
    row.actor = "someone-else"
    with pytest.raises(AuditRecordImmutable):
        row.save()
    with pytest.raises(AuditRecordImmutable):
        row.delete()
    with pytest.raises(AuditRecordImmutable):
        AuditRecord.objects.filter(pk=row.pk).update(actor="x")
    with pytest.raises(AuditRecordImmutable):
        AuditRecord.objects.filter(pk=row.pk).delete()
    assert AuditRecord.objects.get(pk=row.pk).actor == "system"


def test_an_unknown_action_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown audit action"):
        record(action="something_new")


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("secret", [
    "eyJhbGciOiJSUzI1NiIsImtpZCI6ImFiYyJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",  # a JWT
    "gsh_1a2b3c4d_Zm9vYmFyYmF6",  # an API token
    "-----BEGIN PRIVATE KEY-----\nMIIE...\n-----END PRIVATE KEY-----\n",
    "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t",  # the same, base64
    "%2D%2D%2D%2D%2DBEGIN%20CERTIFICATE",
    "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: AAAA\n",
    "Zm9vYmFyYmF6cXV4UXVYMTIzNDU2Nzg5MEFCQ0RFRkdISUpLTE1OT1BR",  # a long mixed base64 run
])
def test_strings_shaped_like_secrets_are_redacted_wherever_they_are(secret):
    row = record(object_repr=secret, changes={"reason": ("old", secret)}, details={"note": [secret, {"deep": secret}]})
    row.refresh_from_db()
    dumped = json.dumps([row.object_repr, row.changes, row.details])
    assert secret not in dumped and json.dumps(secret)[1:-1] not in dumped
    assert row.changes["reason"] == {"old": "old", "new": "[redacted]"}
    assert row.details == {"note": ["[redacted]", {"deep": "[redacted]"}]}


def test_secret_fields_are_recorded_as_changed_without_values_and_plain_values_are_kept():
    row = record(changes={"kubeconfig": ("a", "b"), "private_key_pem": (None, "x"), "image": (None, "quay.io/x/y@sha256:" + "a" * 64)})
    assert row.changes["kubeconfig"] == {"secret": True} and row.changes["private_key_pem"] == {"secret": True}
    assert row.changes["image"]["new"].endswith("a" * 64)  # a hex digest is not a secret


# --------------------------------------------------------------------------- actor


def test_the_actor_comes_from_the_scope_unless_given_and_defaults_to_system():
    assert record().actor == "system"
    with context.actor_scope("command:demo"):
        assert record().actor == "command:demo"
        assert record(actor="console:bob").actor == "console:bob"
        assert record(actor="system").actor == "command:demo"  # the services' default means "not given"
        with context.actor_scope("command:migrate", keep_outer=True):
            assert record().actor == "command:demo"
    assert record().actor == "system"


def test_the_log_line_is_emitted_from_the_row_once_the_transaction_commits(caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.INFO, logger="gshare.audit")
    cluster = ClusterFactory()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        row = services.audit_record(action=AuditRecord.Action.OPERATOR_TOKENS_REVOKE, obj=cluster, details={"generation": 2})
    assert [r for r in caplog.records if r.name == "gshare.audit"] == []  # not before the commit
    for callback in callbacks:
        callback()
    [line] = [r for r in caplog.records if r.name == "gshare.audit"]
    assert line.audit == {"actor": "system", "action": "operator_tokens_revoke", "cluster": cluster.public_id,
                          "cluster_name": cluster.name, "generation": 2}
    assert (row.cluster, row.cluster_name, row.object_type, row.object_id) == (cluster.public_id, cluster.name, "cluster", cluster.public_id)
    assert f"action=operator_tokens_revoke cluster={cluster.public_id}" in line.getMessage()


def test_a_rolled_back_change_leaves_no_row_and_no_line(caplog):
    caplog.set_level(logging.INFO, logger="gshare.audit")
    with pytest.raises(RuntimeError), transaction.atomic():
        record()
        raise RuntimeError("the change failed")
    assert not AuditRecord.objects.exists()
    assert [r for r in caplog.records if r.name == "gshare.audit"] == []


# --------------------------------------------------------------------------- API


@pytest.fixture
def rows():
    c1, c2 = ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2")
    now = datetime.now(UTC)
    made = []
    for i, (actor, action, cluster) in enumerate([
        ("api:alice", AuditRecord.Action.SESSION_CREATE, c1), ("api:bob", AuditRecord.Action.SESSION_STOP, c2),
        ("beat:billing.stop_overdrawn_sessions", AuditRecord.Action.SESSION_STOP, c1), ("console:admin", AuditRecord.Action.PRICE_UPDATE, None),
    ]):
        row = AuditRecord(at=now - timedelta(hours=4 - i), actor=actor, action=action, object_type="session" if cluster else "price",
                          object_id=f"ses_{i}", cluster=cluster.public_id if cluster else "", cluster_name=cluster.name if cluster else "",
                          changes={"phase": {"old": "running", "new": "stopping"}})
        row.save()  # rows are inserted at a chosen moment (never updated)
        made.append(row)
    return made, now


@pytest.mark.django_db
def test_the_api_lists_and_filters_for_staff(http, rows):
    made, now = rows
    body = http.get("/api/v1/audit").json()
    # Newest first: the staff user's API token (created by the fixture, now), then the rows above.
    assert body["count"] == 5 and [r["object"]["id"] for r in body["results"][1:]] == ["ses_3", "ses_2", "ses_1", "ses_0"]
    assert (body["results"][0]["action"], body["results"][0]["object"]["type"]) == ("api_token_create", "api_token")
    first = body["results"][-1]
    assert first["actor"] == "api:alice" and first["action"] == "session_create"
    assert first["cluster"] == {"id": made[0].cluster, "name": "lab-c1"} and body["results"][1]["cluster"] is None
    assert first["changes"] == {"phase": {"old": "running", "new": "stopping"}} and first["object"]["type"] == "session"

    def ids(query: str) -> list[str]:
        response = http.get(f"/api/v1/audit?{query}")
        assert response.status_code == 200, response.text
        return [r["object"]["id"] for r in response.json()["results"]]

    assert ids("actor=api:bob") == ["ses_1"]
    assert ids("actor=api:") == ["ses_1", "ses_0"]
    assert ids("action=session_stop") == ["ses_2", "ses_1"]
    assert ids("cluster=lab-c1") == ["ses_2", "ses_0"] == ids(f"cluster={made[0].cluster}")
    assert ids("cluster=lab-c1&action=session_stop") == ["ses_2"]
    since = (now - timedelta(hours=3, minutes=30)).isoformat()
    until = (now - timedelta(hours=1, minutes=30)).isoformat()
    assert ids(f"since={since.replace('+', '%2B')}")[1:] == ["ses_3", "ses_2", "ses_1"]
    assert ids(f"since={since.replace('+', '%2B')}&until={until.replace('+', '%2B')}") == ["ses_2", "ses_1"]
    assert ids("object=ses_2") == ["ses_2"]
    page = http.get("/api/v1/audit?limit=2&offset=2").json()
    assert page["count"] == 5 and [r["object"]["id"] for r in page["results"]] == ["ses_2", "ses_1"] and page["next"] and page["previous"]


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["since=yesterday", "until=2026-13-01T00:00:00Z", "since=2026-11-29T16:00:00", "until=0001-01-01T00:00:00%2B14:00"])
def test_a_bad_time_filter_is_a_400_json(http, query):
    response = http.get(f"/api/v1/audit?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request" and "ISO 8601" in response.json()["detail"]


@pytest.mark.django_db
def test_only_staff_read_the_trail(http_user, anon, rows):
    response = http_user.get("/api/v1/audit")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert "staff" in response.json()["detail"] and "ses_" not in response.text
    assert anon.get("/api/v1/audit").status_code == 401


def test_the_list_takes_the_same_queries_for_many_rows(client, staff_user, staff_token):
    def listed(n: int) -> int:
        for i in range(n):
            record(object_id=str(i), cluster=ClusterFactory() if i % 2 else None, changes={"x": (i, i + 1)})
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/api/v1/audit?limit=1000", HTTP_AUTHORIZATION=f"Bearer {staff_token}")
        assert response.status_code == 200
        return len(queries)

    listed(0)  # the token's first use records last_used_at (one more query, once a minute)
    few = listed(2)
    many = listed(40)
    assert few == many == 3, (few, many)  # the token, the count, the page


# --------------------------------------------------------------------------- console


def test_the_console_page_is_read_only_and_filters(client, staff_user):
    client.force_login(staff_user)
    cluster = ClusterFactory(name="lab-c1")
    with context.actor_scope("api:alice"):
        row = services.audit_record(action=AuditRecord.Action.CLUSTER_UPDATE, obj=cluster, changes={"session_domain": ("a", "b")})
    marker = cluster.public_id.encode()  # shown in the row's object column (the filters' sidebar lists actors and names)

    def listed(response) -> bytes:  # the results only: the top bar's Cluster selector lists every cluster's id
        return response.content.partition(b'id="result_list"')[2]

    page = client.get("/audit/auditrecord/")
    assert page.status_code == 200 and marker in listed(page) and b"session_domain" in page.content
    for query in ("actor_kind=api", "actor=api:alice", "action=cluster_update", "cluster_name=lab-c1", f"at__year={row.at.year}&at__month={row.at.month}"):
        filtered = client.get(f"/audit/auditrecord/?{query}")
        assert filtered.status_code == 200 and marker in listed(filtered), query
    for query in ("actor_kind=beat", "action=cluster_register", f"at__year={row.at.year - 1}"):
        assert marker not in listed(client.get(f"/audit/auditrecord/?{query}")), query
    detail = client.get(f"/audit/auditrecord/{row.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content and b"deletelink" not in detail.content
    assert client.get("/audit/auditrecord/add/").status_code == 403
    assert client.post(f"/audit/auditrecord/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post("/audit/auditrecord/", {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"}).status_code in (200, 302)
    assert AuditRecord.objects.filter(pk=row.pk).exists()
    assert AuditRecord.objects.get(pk=row.pk).actor == "api:alice"


def test_the_console_list_takes_the_same_queries_for_many_rows(client, staff_user):
    client.force_login(staff_user)

    def listed(n: int) -> int:
        for i in range(n):
            record(object_id=f"x{i}", cluster=ClusterFactory() if i % 2 else None, changes={"x": (i, i + 1)})
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/audit/auditrecord/").status_code == 200
        return len(queries)

    listed(1)
    assert listed(2) == listed(30)


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["actor=" + "a" * 5000, "cluster=%F0%9F%92%A5", "action=%FF%FE", "object=clu_", "limit=99999999999999999999",
                                   "offset=-1", "actor=beat:&cluster=clu_nope&since=2026-01-01T00:00:00%2B00:00"])
def test_odd_filters_answer_json_never_500(http, query):
    response = http.get(f"/api/v1/audit?{query}")
    # 404 cluster_not_found: a ?cluster= naming no cluster, as in every list (clusters.filters.ClusterRefFilter)
    assert response.status_code in (200, 400, 404), response.text
    assert response.headers["Content-Type"].startswith("application/json")
