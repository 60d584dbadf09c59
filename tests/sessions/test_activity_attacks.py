"""Attacks on ``POST /internal/v1/activity`` and the connections connect verify notes: stolen or stale credentials,
hostile bodies, crossing reports and flushes, Redis going away. Each answer is a 4xx or a 200 with a consistent
state, never a 500 nor a half-applied report."""

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache

from clusters.operator_token.rotation import credential_generation_bump
from clusters.operator_token.tokens import operator_token_mint
from identity.tokens import api_token_create
from sessions import activity, connect, services
from sessions.models import SessionActivity
from tests.factories import ClusterFactory, SessionFactory
from tests.helpers import iso, run_threads
from tests.sessions.test_activity import entry, gpu

pytestmark = pytest.mark.django_db
PATH = "/internal/v1/activity"


@pytest.fixture
def running(django_user_model):
    owner = django_user_model.objects.create_user("ada")
    return SessionFactory(cluster=ClusterFactory(session_domain="gpu-a.example.com"), owner=owner, gpus=1, devices=["GPU-a"])


@pytest.fixture
def operator(http_for, running):
    return http_for(operator_token_mint(cluster_id=running.cluster.public_id))


def body_of(running, **gpu_fields):
    return {"sessions": [entry(running, gpus=[gpu("GPU-a", **gpu_fields)])]}


# --- credentials ---------------------------------------------------------------------------------------------------


def test_no_forged_expired_revoked_or_user_token_may_report(http_for, running, staff_user):
    cluster = running.cluster
    expired = operator_token_mint(cluster_id=cluster.public_id, ttl=1)
    revoked = operator_token_mint(cluster_id=cluster.public_id)
    valid = operator_token_mint(cluster_id=cluster.public_id)
    forged = valid[:-6] + ("AAAAAA" if not valid.endswith("AAAAAA") else "BBBBBB")
    staff_api_token = api_token_create(username=staff_user.username)[1]
    time.sleep(2)
    credential_generation_bump(cluster=cluster, actor="test", action="operator_tokens_revoke")
    for token in (None, "garbage", forged, expired, revoked, valid, staff_api_token):
        answer = http_for(token).post(PATH, json=body_of(running))
        assert answer.status_code in (401, 403), (token and token[:12], answer.status_code, answer.text)
        assert answer.headers["Content-Type"].startswith("application/json")
    assert not SessionActivity.objects.exists()
    fresh = http_for(operator_token_mint(cluster_id=cluster.public_id)).post(PATH, json=body_of(running))
    assert fresh.status_code == 200, fresh.text


def test_an_operator_token_is_no_api_token(http_for, running, operator):
    token = operator.session.headers["Authorization"].split()[1]
    answer = http_for(token).post(f"/api/v1/sessions/{running.public_id}/idle-exemption",
                                  json={"until": iso(datetime.now(UTC) + timedelta(hours=1)), "reason": "x"})
    assert answer.status_code == 401, answer.text
    assert not SessionActivity.objects.exists()


# --- hostile bodies ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, at", [
    (1e12, None),  # the schema's maximum: 31,700 years before the sample, before year 1
    (999_999_999_999.9, None),
    (1.0, "0001-01-01T00:00:00Z"),  # a sample taken at the first instant a datetime holds
    (86_400 * 800_000, "2026-12-01T10:00:00Z"),
])
def test_a_kernel_age_reaching_before_year_one_is_no_crash(operator, running, seconds, at):
    body = body_of(running, kernel=seconds)
    if at:
        body["sessions"][0]["sampled_at"] = body["sessions"][0]["gpus"][0]["sampled_at"] = at
    answer = operator.post(PATH, json=body)
    assert answer.status_code == 200, answer.text
    row = SessionActivity.objects.get(session=running)
    assert row.state == "ok" and row.last_kernel_at is None, "a kernel older than time itself is no kernel seen"


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e309", "-1e309"])
def test_non_finite_numbers_are_refused(operator, running, raw):
    text = json.dumps(body_of(running)).replace('"utilization_percent": 80.0', f'"utilization_percent": {raw}')
    assert raw in text
    answer = operator.post(PATH, data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert not SessionActivity.objects.exists()


@pytest.mark.parametrize("field, value", [
    ("reason", "monitor\x00down"),
    ("reason", "monitor \ud800 down"),
    ("device_uuid", "GPU-\x00a"),
    ("device_uuid", "GPU-\udfffa"),
])
def test_nul_characters_and_lone_surrogates_are_refused(operator, running, field, value):
    body = {"sessions": [entry(running, gpus=[gpu("GPU-a")])]}
    target = body["sessions"][0]["gpus"][0] if field == "device_uuid" else body["sessions"][0]
    target[field] = value
    text = json.dumps(body)  # json.dumps escapes both (\u0000, \ud800): what a client may send
    answer = operator.post(PATH, data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_activity", answer.text
    assert not SessionActivity.objects.exists()


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00", "2026-12-01T10:00:00+24:00",
                                   "2026-12-01T10:00:00+00:00:30", "+2026-12-01T10:00:00Z", "2026-02-30T10:00:00Z"])
def test_absurd_times_are_refused(operator, running, value):
    body = body_of(running)
    body["sessions"][0]["sampled_at"] = value
    answer = operator.post(PATH, json=body)
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_activity", answer.text


def test_floats_where_integers_are_required_are_refused_but_whole_floats_pass(operator, running):
    assert operator.post(PATH, json=body_of(running, used=1.5)).status_code == 400
    assert operator.post(PATH, json=body_of(running, limit=2**64)).status_code == 400  # past int64
    answer = operator.post(PATH, json=body_of(running, used=1024.0))  # JSON Schema: 1024.0 is an integer
    assert answer.status_code == 200, answer.text
    assert SessionActivity.objects.get(session=running).gpus[0]["memory_used_bytes"] == 1024


def test_deep_nesting_is_a_400(operator):
    text = '{"sessions": ' + "[" * 100_000 + "]" * 100_000 + "}"
    answer = operator.post(PATH, data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:200]


def test_duplicate_keys_mean_the_last_one(operator, running):
    one = entry(running, gpus=[gpu("GPU-a", util=10.0)])
    text = json.dumps({"sessions": [one]}).replace('"utilization_percent": 10.0', '"utilization_percent": 10.0, "utilization_percent": 55.0')
    answer = operator.post(PATH, data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert SessionActivity.objects.get(session=running).gpus[0]["utilization_percent"] == 55.0


def test_the_largest_report_the_schema_allows_answers_413_not_500(operator, running, settings):
    """5000 sessions of 64 GPUs is about 75 MB of JSON: past ``GSHARE_MAX_BODY_BYTES`` (32 MiB), refused before parsing."""
    at = iso(datetime.now(UTC))
    one_gpu = {"device_uuid": "GPU-" + "f" * 36, "last_kernel_seconds": 12.5, "utilization_percent": 87.5,
               "memory_used_bytes": 2**33, "memory_limit_bytes": 2**34, "sampled_at": at}
    sessions = [{"session": f"ses_{i:032d}", "node": "gpu-h100-01", "state": "ok", "reason": "", "sampled_at": at,
                 "gpus": [{**one_gpu, "device_uuid": f"GPU-{i:08d}-{j:027d}"} for j in range(64)]} for i in range(5000)]
    text = json.dumps({"sessions": sessions})
    assert len(text) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    answer = operator.post(PATH, data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413 and answer.json()["code"] == "request_too_large", answer.text[:200]


def test_a_stopping_or_ended_sessions_reading_changes_nothing(operator, running):
    operator.post(PATH, json=body_of(running, kernel=100.0))
    before = SessionActivity.objects.get(session=running)
    for stopped in ("Stopping", "Terminated", "Failed"):
        type(running).objects.filter(pk=running.pk).update(phase=stopped)
        later = datetime.now(UTC) + timedelta(seconds=1)
        answer = operator.post(PATH, json={"sessions": [entry(running, at=later, gpus=[gpu("GPU-a", kernel=0.0, at=later)])]})
        assert (answer.status_code, answer.json()["accepted"], answer.json()["ignored"]) == (200, 0, 1)
    after = SessionActivity.objects.get(session=running)
    assert (after.sampled_at, after.last_kernel_at) == (before.sampled_at, before.last_kernel_at)


# --- crossing reports and flushes ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_crossing_reports_never_put_an_older_reading_over_a_newer_one(http_for, live_server, django_user_model):
    cluster = ClusterFactory()
    session = SessionFactory(cluster=cluster, gpus=1, devices=["GPU-a"])
    token = operator_token_mint(cluster_id=cluster.public_id)
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=50)
    answers = []

    def report(offset):
        at = base + timedelta(seconds=offset)
        body = {"sessions": [entry(session, at=at, gpus=[gpu("GPU-a", kernel=float(offset), util=float(offset), at=at)])]}
        answers.append(http_for(token).post(PATH, json=body).status_code)

    run_threads(report, [(i,) for i in range(40)])
    assert answers == [200] * 40
    row = SessionActivity.objects.get(session=session)
    assert row.sampled_at == base + timedelta(seconds=39) and row.gpus[0]["utilization_percent"] == 39.0
    assert row.last_kernel_at == base  # offset i ran a kernel at base + i - i: all agree


@pytest.mark.django_db(transaction=True)
def test_reports_and_flushes_over_many_sessions_in_opposite_orders_do_not_deadlock(http_for, live_server):
    cluster = ClusterFactory()
    sessions = [SessionFactory(cluster=cluster, gpus=1, devices=["GPU-a"]) for _ in range(150)]
    token = operator_token_mint(cluster_id=cluster.public_id)
    client = activity._redis()
    errors = []

    def report(order, rounds):
        for _ in range(rounds):
            at = datetime.now(UTC)
            body = {"sessions": [entry(s, at=at, gpus=[gpu("GPU-a", at=at)]) for s in order]}
            answer = http_for(token).post(PATH, json=body)
            if answer.status_code != 200:
                errors.append(answer.text[:300])

    def flush(order, rounds):
        from django.db import connection

        try:
            for _ in range(rounds):
                client.hset(activity._hash_key(), mapping={s.public_id: str(int(time.time())) for s in order})
                activity.connections_flush()
        except Exception as exc:  # a deadlock is the failure looked for
            errors.append(repr(exc))
        finally:
            connection.close()

    client.delete(activity._hash_key())
    forward, backward = sessions, sessions[::-1]
    run_threads(lambda kind, order: (report if kind == "r" else flush)(order, 20),
                [("r", forward), ("r", backward), ("f", backward), ("f", forward)], timeout=120)
    assert not errors, errors[:3]
    assert SessionActivity.objects.filter(last_connected_at__isnull=False).count() == 150


@pytest.mark.django_db(transaction=True)
def test_two_workers_flushing_at_once_lose_and_double_nothing(django_user_model):
    sessions = [SessionFactory(gpus=1) for _ in range(60)]
    client = activity._redis()
    client.delete(activity._hash_key())
    moment = int(time.time())
    client.hset(activity._hash_key(), mapping={s.public_id: str(moment) for s in sessions})
    written = []

    def flush():
        from django.db import connection

        try:
            written.append(activity.connections_flush())
        finally:
            connection.close()

    run_threads(flush, [() for _ in range(4)])
    assert sum(written) == 60 and sorted(written)[-1] == 60, written
    assert SessionActivity.objects.filter(last_connected_at=datetime.fromtimestamp(moment, UTC)).count() == 60
    assert client.hlen(activity._hash_key()) == 0


# --- Redis going away ----------------------------------------------------------------------------------------------


@pytest.fixture
def closed_port() -> str:
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    host_port = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    return host_port


def test_verify_lets_in_and_skips_the_note_when_redis_goes_away(client, running, settings, closed_port, caplog):
    """Verify's facts are cached in the process for a second: a Redis that fails right after still lets the user in;
    the note is skipped (logged), and the token is in no log line."""
    cache.clear()
    connect.clear_local_caches()
    activity.forget_noted()
    url = services.session_connect(session=running, user=running.owner)
    token = url.split("token=")[1]
    headers = {"HTTP_X_ORIGINAL_URL": f"https://gpu-a.example.com/s/{running.public_id}/lab", "HTTP_X_ORIGINAL_METHOD": "GET",
               "HTTP_AUTHORIZATION": f"Bearer {token}"}
    assert client.get("/internal/connect/verify", **headers).status_code == 200  # facts now in this process
    activity._redis().delete(activity._hash_key())
    activity.forget_noted()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{closed_port}/0"}}
    with caplog.at_level(logging.DEBUG):
        answer = client.get("/internal/connect/verify", **headers)
    assert answer.status_code in (200, 503), answer.status_code
    if answer.status_code == 200:
        assert any("could not note a connection" in r.getMessage() for r in caplog.records)
    assert all(token not in r.getMessage() for r in caplog.records)
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": settings.CACHES["default"]["LOCATION"]}}


def test_connections_pending_reads_nothing_when_redis_is_away(running, settings, closed_port, monkeypatch, caplog):
    import redis.connection

    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{closed_port}/0"}}
    dials: list[int] = []
    real = redis.connection.Connection._connect

    def counting(self):
        dials.append(1)
        return real(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counting)
    with caplog.at_level(logging.WARNING):
        assert activity.connections_pending([running.public_id]) is None
    # one bounded read given up on: a few dials (redis-py's own retries), each with the verify's timeouts, then a warning
    kwargs = activity._redis().connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == connect.CACHE_TIMEOUT_SECONDS
    assert 1 <= len(dials) <= 4, len(dials)
    assert [r.getMessage() for r in caplog.records if "could not read the pending connections" in r.getMessage()]
