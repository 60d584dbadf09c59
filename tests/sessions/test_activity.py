"""``POST /internal/v1/activity`` (HAMi vGPU monitor readings per session) and the connections connect verify notes."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.operator_token.tokens import operator_token_mint
from sessions import activity
from sessions.models import Session, SessionActivity
from tests.factories import ClusterFactory, SessionFactory
from tests.helpers import iso

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(django_user_model):
    owner = django_user_model.objects.create_user("ada")
    cluster = ClusterFactory()
    session = SessionFactory(cluster=cluster, owner=owner, gpus=2, devices=["GPU-a", "GPU-b"])
    return session


@pytest.fixture
def operator(http_for, running):
    return http_for(operator_token_mint(cluster_id=running.cluster.public_id))


def gpu(uuid, *, kernel=5.0, util=80.0, used=2 << 30, limit=10 << 30, at=None):
    return {"device_uuid": uuid, "last_kernel_seconds": kernel, "utilization_percent": util, "memory_used_bytes": used,
            "memory_limit_bytes": limit, "sampled_at": iso(at or datetime.now(UTC))}


def entry(session, *, gpus=(), state="ok", reason="", at=None, node="gpu-a"):
    return {"session": session.public_id, "node": node, "state": state, "reason": reason, "sampled_at": iso(at or datetime.now(UTC)),
            "gpus": list(gpus)}


def test_a_reading_is_stored_per_gpu_and_shown_on_the_session(operator, running, http_for, staff_token):
    at = datetime.now(UTC).replace(microsecond=0)
    body = {"sessions": [entry(running, at=at, gpus=[gpu("GPU-a", kernel=30, at=at), gpu("GPU-b", kernel=4000, util=0, at=at)])]}
    answer = operator.post("/internal/v1/activity", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 1 and answer.json()["ignored"] == 0 and "server_time" in answer.json()
    row = SessionActivity.objects.get(session=running)
    assert row.state == "ok" and row.sampled_at == at
    assert row.last_kernel_at == at - timedelta(seconds=30)  # the busiest GPU counts
    shown = http_for(staff_token).get(f"/api/v1/sessions/{running.public_id}").json()
    assert shown["activity"]["state"] == "ok"
    assert [g["device_uuid"] for g in shown["activity"]["gpus"]] == ["GPU-a", "GPU-b"]
    assert shown["activity"]["gpus"][1]["utilization_percent"] == 0
    assert shown["activity"]["gpus"][0]["memory_limit_bytes"] == 10 << 30
    assert datetime.fromisoformat(shown["activity"]["last_kernel_at"]) == at - timedelta(seconds=30)
    assert shown["idle_since"] is None and shown["stops_at"] is None and shown["stop_reason"] == ""


def test_an_older_reading_is_ignored_and_the_last_kernel_never_moves_back(operator, running):
    now = datetime.now(UTC).replace(microsecond=0)
    operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=now, gpus=[gpu("GPU-a", kernel=10, at=now)])]})
    older = now - timedelta(seconds=30)
    operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=older, gpus=[gpu("GPU-a", kernel=0, util=99, at=older)])]})
    row = SessionActivity.objects.get(session=running)
    assert row.sampled_at == now and row.gpus[0]["utilization_percent"] == 80.0
    later = now + timedelta(seconds=30)
    operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=later, gpus=[gpu("GPU-a", kernel=500, at=later)])]})
    row.refresh_from_db()
    assert row.sampled_at == later and row.last_kernel_at == now - timedelta(seconds=10)


def test_an_unknown_reading_keeps_the_last_kernel_and_says_why(operator, running, http_for, staff_token):
    now = datetime.now(UTC).replace(microsecond=0)
    operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=now, gpus=[gpu("GPU-a", kernel=1, at=now)])]})
    later = now + timedelta(seconds=30)
    why = "the vGPU monitor of node gpu-a answered 503 through the apiserver's pod proxy"
    assert operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=later, state="unknown", reason=why)]}).status_code == 200
    row = SessionActivity.objects.get(session=running)
    assert row.state == "unknown" and row.reason == why and row.gpus == [] and row.last_kernel_at == now - timedelta(seconds=1)
    shown = http_for(staff_token).get(f"/api/v1/sessions/{running.public_id}").json()["activity"]
    assert (shown["state"], shown["reason"], shown["gpus"]) == ("unknown", why, [])


def test_another_clusters_or_an_unknown_session_refuses_the_whole_report(http_for, running):
    other = SessionFactory(cluster=ClusterFactory())
    foreign = http_for(operator_token_mint(cluster_id=other.cluster.public_id))
    for named in (running.public_id, "ses_nosuchsession"):
        body = {"sessions": [entry(other), {**entry(running), "session": named}]}
        answer = foreign.post("/internal/v1/activity", json=body)
        assert answer.status_code == 403 and answer.json()["code"] == "forbidden_cluster_scope"
        assert named in answer.json()["detail"]
    assert not SessionActivity.objects.exists()


@pytest.mark.parametrize("mangle, code", [
    (lambda b: b["sessions"].append(dict(b["sessions"][0])), "invalid_activity"),
    (lambda b: b["sessions"][0]["gpus"].append(dict(b["sessions"][0]["gpus"][0])), "invalid_activity"),
    (lambda b: b["sessions"][0].update(state="unknown"), "invalid_activity"),
    (lambda b: b["sessions"][0].update(sampled_at="yesterday"), "invalid_activity"),
    (lambda b: b["sessions"][0]["gpus"][0].update(utilization_percent=101), "invalid_activity"),
    (lambda b: b["sessions"][0]["gpus"][0].update(last_kernel_seconds=-1), "invalid_activity"),
    (lambda b: b["sessions"][0]["gpus"][0].update(memory_used_bytes=1.5), "invalid_activity"),
    (lambda b: b["sessions"][0].update(session="ses_../x"), "invalid_activity"),
    (lambda b: b.update(sessions="all"), "invalid_activity"),
])
def test_malformed_reports_are_refused_whole(operator, running, mangle, code):
    body = {"sessions": [entry(running, gpus=[gpu("GPU-a")])]}
    mangle(body)
    answer = operator.post("/internal/v1/activity", json=body)
    assert answer.status_code == 400 and answer.json()["code"] == code, answer.text
    assert not SessionActivity.objects.exists()


def test_sessions_that_are_not_running_are_ignored(operator, running):
    Session.objects.filter(pk=running.pk).update(phase=Session.Phase.STOPPING)
    answer = operator.post("/internal/v1/activity", json={"sessions": [entry(running, gpus=[gpu("GPU-a")])]}).json()
    assert (answer["accepted"], answer["ignored"]) == (0, 1)
    assert not SessionActivity.objects.exists()


def test_a_reading_from_a_clock_ahead_counts_as_now(operator, running):
    ahead = datetime.now(UTC) + timedelta(days=365)
    operator.post("/internal/v1/activity", json={"sessions": [entry(running, at=ahead, gpus=[gpu("GPU-a", kernel=0, at=ahead)])]})
    row = SessionActivity.objects.get(session=running)
    assert row.sampled_at < datetime.now(UTC) + timedelta(minutes=2) and row.last_kernel_at < datetime.now(UTC) + timedelta(minutes=2)


def test_queries_do_not_grow_with_the_sessions(running):
    cluster = running.cluster
    counts = []
    for n in (1, 40):
        sessions = [SessionFactory(cluster=cluster, owner=running.owner) for _ in range(n)]
        with CaptureQueriesContext(connection) as queries:
            activity.activity_report_apply(cluster=cluster, entries=[entry(s, gpus=[gpu("GPU-x")]) for s in sessions])
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 4, counts


def test_connections_are_noted_once_a_minute_in_redis_and_flushed_to_the_database(running, settings):
    activity.forget_noted()
    client = activity._redis()
    client.delete(activity._hash_key())
    first = datetime.now(UTC).replace(microsecond=0)
    activity.connection_note(running.public_id, now=first)
    assert activity.connections_pending([running.public_id]) == {running.public_id: first}
    client.delete(activity._hash_key())
    activity.connection_note(running.public_id, now=first + timedelta(seconds=5))
    assert activity.connections_pending([running.public_id]) == {}, "a second verify in the same minute writes nothing"
    activity.forget_noted()
    activity.connection_note(running.public_id, now=first + timedelta(seconds=61))
    assert activity.connections_flush() == 1
    assert SessionActivity.objects.get(session=running).last_connected_at == first + timedelta(seconds=61)
    assert activity.connections_pending([running.public_id]) == {} and activity.connections_flush() == 0
    # An older note (another api process's clock) never moves it back.
    client.hset(activity._hash_key(), running.public_id, str(int(first.timestamp())))
    activity.connections_flush()
    assert SessionActivity.objects.get(session=running).last_connected_at == first + timedelta(seconds=61)


def test_a_failed_flush_puts_the_notes_back(running, monkeypatch):
    activity.forget_noted()
    client = activity._redis()
    client.delete(activity._hash_key())
    activity.connection_note(running.public_id)
    monkeypatch.setattr(activity, "_FLUSH", "SELECT no_such_function()")
    with pytest.raises(Exception):  # noqa: B017 - any database error
        activity.connections_flush()
    assert running.public_id in activity.connections_pending([running.public_id])
