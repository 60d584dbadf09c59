# ruff: noqa: F811 -- the fixtures world and as_alice are imported from test_researcher
"""Researcher isolation on the console's own views, bad input to the console forms, the API with
the login session (CSRF, Origin), internal routes with the session cookie, and stored XSS from operator reports."""

from __future__ import annotations

import pytest
from django.test import Client

from clusters.models import Cluster
from identity.models import ApiToken
from sessions.models import Session, SuggestedImage
from storage.models import Volume
from tests.console.test_researcher import PASSWORD, as_alice, world  # noqa: F401 -- fixtures
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, StoragePoolFactory, VolumeFactory

pytestmark = pytest.mark.django_db
XSS = '"><img src=x onerror=alert(1)>'


def _ok(response):
    assert response.status_code < 500, (response.status_code, response.content[:500])


def _refused(response) -> bool:
    """Whether the page shows a form error (Django's ``errorlist``) or a service refusal with its code."""
    body = response.content.decode()
    return 'class="errorlist' in body or 'class="gs-refusal-code"' in body


# --- researcher isolation on the console's own views ---------------------------------------------------------------
def test_alice_cannot_poll_open_stop_bobs_session(as_alice, world):
    bob_session = world["rows"]["bob"]["session"]
    base = f"/gpu_sessions/session/{bob_session.pk}"
    assert as_alice.get(f"{base}/status/").status_code == 404
    assert as_alice.post(f"{base}/open/").status_code == 404
    assert as_alice.post(f"{base}/stop/", {"post": "yes"}).status_code == 404
    assert as_alice.get(f"{base}/history/").status_code == 404
    bob_session.refresh_from_db()
    assert bob_session.phase == "Running"
    for junk in ("abc", "-1", "9" * 40, "%00", "1%2F..%2F2"):
        _ok(as_alice.get(f"/gpu_sessions/session/{junk}/status/"))
        _ok(as_alice.post(f"/gpu_sessions/session/{junk}/stop/"))


def test_alice_cannot_see_bobs_token_created_page(as_alice, world):
    token = world["rows"]["bob"]["token"]
    assert as_alice.get(f"/gshare/apitoken/{token.pk}/created/").status_code == 404


def test_autocomplete_and_popups(as_alice, world):
    for app, model, field in (("gpu_sessions", "session", "owner"), ("storage", "volume", "owner"), ("gshare", "apitoken", "user")):
        r = as_alice.get("/autocomplete/", {"app_label": app, "model_name": model, "field_name": field, "term": "b"})
        assert r.status_code in (403, 404)
    r = as_alice.get("/gpu_sessions/session/", {"_popup": "1", "_to_field": "owner"})
    _ok(r)
    assert b"bob" not in r.content
    r = as_alice.get("/gpu_sessions/session/", {"owner__id__exact": world["bob"].pk})
    assert b"bob-notebook" not in r.content and world["rows"]["bob"]["session"].public_id.encode() not in r.content
    r = as_alice.get("/gpu_sessions/session/", {"q": "bob"})
    assert world["rows"]["bob"]["session"].public_id.encode() not in r.content
    change = f"/gpu_sessions/session/{world['rows']['alice']['session'].pk}/change/"
    r = as_alice.get(change, {"_changelist_filters": f"owner__id__exact={world['bob'].pk}"})
    _ok(r)
    assert world["rows"]["bob"]["session"].public_id.encode() not in r.content


def test_select_across_action_only_touches_own(as_alice, world):
    r = as_alice.post("/gpu_sessions/session/", {"action": "stop", "select_across": "1", "index": "0", "post": "yes",
                                                 "_selected_action": [str(world["rows"]["alice"]["session"].pk)]})
    _ok(r)
    assert Session.objects.get(pk=world["rows"]["bob"]["session"].pk).phase == "Running"
    r = as_alice.post("/gshare/apitoken/", {"action": "revoke", "select_across": "1", "index": "0", "_selected_action": []})
    _ok(r)
    assert ApiToken.objects.get(pk=world["rows"]["bob"]["token"].pk).revoked_at is None


# --- the Start session form ------------------------------------------------------------------------------------------
def _start(client, **fields):
    data = {"image": "quay.io/jupyter/base-notebook", "gpus": "1", "share": "whole", "idempotency_key": "k-" + str(len(str(fields))),
            **fields}
    return client.post("/gpu_sessions/session/start/", data)


@pytest.mark.parametrize("fields", [
    {"gpus": "99999999999999999999999"}, {"gpus": "-1"}, {"gpus": "abc"}, {"gpus": "1e3"}, {"gpus": "١"},
    {"share": "share", "gpu_memory_mib": "-5"}, {"share": "share", "gpu_memory_mib": "99999999999999999999999"},
    {"share": "share", "gpu_memory_mib": str(2**40)}, {"share": "share", "gpu_cores": "1000"},
    {"share": "share", "gpu_memory_mib": str(2**31)},
    {"share": "bogus"}, {"image": "x" * 10_000}, {"image": "é" * 500}, {"image": "\u202e\u0000"}, {"image": "   "},
    {"name": "n" * 10_000}, {"name": "<script>"}, {"cluster": "x" * 10_000}, {"cluster": "clu_" + "z" * 60},
    {"volumes": ["vol_nope"]}, {"volumes": ["x" * 5000]}, {"volumes": [f"vol_{i}" for i in range(500)]},
    {"idempotency_key": "x" * 10_000}, {"idempotency_key": "\t"},
])
def test_start_form_bad_input_never_500(as_alice, world, fields):
    r = _start(as_alice, **fields)
    _ok(r)
    # The form comes back with the field's error or the service's refusal and its code, and nothing is started.
    assert r.status_code == 200 and _refused(r), r.content[:500]
    assert not Session.objects.filter(owner=world["alice"]).exclude(pk=world["rows"]["alice"]["session"].pk).exists()


def test_start_form_bobs_volume_and_deregistered_cluster(as_alice, world):
    bob_volume = world["rows"]["bob"]["volume"]
    r = _start(as_alice, volumes=[bob_volume.public_id])
    _ok(r)
    assert b"volume_not_found" in r.content
    gone = ClusterFactory(name="lab-gone", status=Cluster.Status.DEREGISTERED)
    r = _start(as_alice, cluster=gone.public_id, idempotency_key="k-gone")
    _ok(r)
    assert not Session.objects.filter(cluster=gone).exists()


# --- volume create / resize, token create -------------------------------------------------------------------------
@pytest.mark.parametrize("fields", [
    {"name": "x" * 10_000, "quota_gb": "10"}, {"name": "é-data", "quota_gb": "10"}, {"name": "ok", "quota_gb": "-1"},
    {"name": "ok2", "quota_gb": "99999999999999999999"}, {"name": "ok3", "quota_gb": str(2**31)}, {"name": "ok4", "quota_gb": "abc"},
    {"name": "ok5", "quota_gb": "10", "storage_pool": "99999999"}, {"name": "ok6", "quota_gb": "10", "mount_cluster": "abc"},
    {"name": "<script>", "quota_gb": "1"},
])
def test_volume_create_bad_input(as_alice, world, fields):
    volumes = Volume.objects.count()
    r = as_alice.post("/storage/volume/add/", fields)
    _ok(r)
    assert r.status_code == 200 and _refused(r), r.content[:500]
    assert Volume.objects.count() == volumes


@pytest.mark.parametrize("quota", ["-1", "0", "99999999999999999999", str(2**31), str(2**31 - 1), "abc", "1.5"])
def test_volume_resize_bad_input(as_alice, world, quota):
    volume = world["rows"]["alice"]["volume"]
    before = Volume.objects.values_list("quota_gb", flat=True).get(pk=volume.pk)
    r = as_alice.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": quota})
    _ok(r)
    assert r.status_code == 200 and _refused(r), r.content[:500]
    assert Volume.objects.values_list("quota_gb", flat=True).get(pk=volume.pk) == before


def test_volume_resize_bobs(as_alice, world):
    volume = world["rows"]["bob"]["volume"]
    assert as_alice.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": "500"}).status_code == 404


@pytest.mark.parametrize(("name", "accepted"), [("x" * 10_000, False), ("", False), ("é" * 100, True), (XSS, True)])
def test_token_create_bad_input(as_alice, world, name, accepted):
    tokens = ApiToken.objects.count()
    r = as_alice.post("/gshare/apitoken/add/", {"name": name})
    _ok(r)
    if accepted:  # any printable name of a fitting length is a name; it is shown escaped (test_stored_xss_everywhere)
        assert r.status_code == 302 and ApiToken.objects.filter(user=world["alice"], name=name).exists()
    else:
        assert r.status_code == 200 and _refused(r) and ApiToken.objects.count() == tokens


def test_token_text_not_in_session_plaintext_and_shown_once(as_alice, world, caplog):
    r = as_alice.post("/gshare/apitoken/add/", {"name": "probe"})
    assert r.status_code == 302
    raw = str(dict(as_alice.session.items()))
    assert "gsh_" not in raw, raw
    page = as_alice.get(r.headers["Location"]).content.decode()
    import re
    texts = re.findall(r"gsh_[A-Za-z0-9_\-]+", page)
    assert texts
    assert not any(t in caplog.text for t in texts)
    assert texts[0] not in as_alice.get(r.headers["Location"]).content.decode()
    from audit.models import AuditRecord
    assert not any(texts[0] in str(row.__dict__) for row in AuditRecord.objects.all())


# --- the API with the login session ----------------------------------------------------------------------------------
def test_api_session_csrf_and_origin(world):
    c = Client(enforce_csrf_checks=True)
    c.force_login(world["alice"])
    r = c.post("/api/v1/storage/volumes", {"name": "csrf-probe", "quota_gb": 1}, content_type="application/json")
    assert r.status_code == 403
    vol = world["rows"]["alice"]["volume"]
    for method in ("patch", "delete", "put"):
        r = getattr(c, method)(f"/api/v1/storage/volumes/{vol.public_id}", {"quota_gb": 20}, content_type="application/json")
        assert r.status_code in (403, 405)
    c.get("/")  # sets the csrftoken cookie
    token = c.cookies["csrftoken"].value
    r = c.post("/api/v1/storage/volumes", {"name": "csrf-probe2", "quota_gb": 1}, content_type="application/json",
               headers={"X-CSRFToken": token, "Origin": "http://evil.example"})
    assert r.status_code == 403
    # text/plain body (simple CORS request) without a token must be refused too
    r = c.generic("POST", "/api/v1/sessions", b'{"image":"x","gpus":1}', content_type="text/plain")
    assert r.status_code in (403, 415)


def test_internal_routes_refuse_the_session(world):
    c = Client()
    c.force_login(world["staff"])
    for path in ("/internal/v1/usage", "/internal/v1/storage", "/internal/v1/inventory", "/internal/v1/heartbeat"):
        r = c.post(path, {}, content_type="application/json")
        assert r.status_code in (401, 403, 404, 405)


# --- stored XSS from operator reports and users ----------------------------------------------------------------------
def test_stored_xss_everywhere(client, world):
    cluster = ClusterFactory(name="lab-x", status=Cluster.Status.DEGRADED, status_message=XSS) \
        if hasattr(Cluster, "status_message") else ClusterFactory(name="lab-x")
    node = NodeFactory(cluster=cluster, name="node-x", labels={XSS: XSS, "nvidia.com/gpu.product": XSS, "a": XSS},
                       gpu_mode=XSS)
    device = GpuDeviceFactory(node=node, model=XSS)
    session = SessionFactory(owner=world["alice"], cluster=cluster, name=XSS, image=XSS, message=XSS, node=XSS, devices=[XSS])
    from sessions.models import Allocation
    Allocation.objects.create(session=session, device=device, memory_mib=10, cores=1)
    pool = StoragePoolFactory(cluster=cluster, name="pool-x")
    VolumeFactory(owner=world["alice"], pool=pool, name="vol-x", status_message=XSS)
    SuggestedImage.objects.create(image=XSS, description=XSS)
    from identity.tokens import api_token_create
    api_token_create(username="alice", name=XSS)
    pages = ["/", "/clusters/node/", f"/clusters/node/{node.pk}/change/", "/clusters/gpudevice/",
             f"/clusters/gpudevice/{device.pk}/change/", "/gpu_sessions/session/", f"/gpu_sessions/session/{session.pk}/change/",
             "/gpu_sessions/session/start/", "/storage/volume/", "/gshare/apitoken/", "/clusters/cluster/",
             "/gpu_sessions/allocation/", "/gpu_sessions/suggestedimage/"]
    for who in ("staff", "alice"):
        client.force_login(world[who])
        for url in pages:
            r = client.get(url)
            body = r.content.decode()
            assert "<img src=x" not in body, (who, url)


def test_xss_cluster_name_topbar_message_and_forms(client, world):
    ClusterFactory(name=XSS, session_domain="x.example")
    for who in ("staff", "alice"):
        client.force_login(world[who])
        for url in ("/", "/gpu_sessions/session/", "/gpu_sessions/session/start/", "/storage/volume/add/"):
            body = client.get(url).content.decode()
            assert "<img src=x" not in body, (who, url)
        r = client.get("/", {"cluster": "<img src=x onerror=alert(2)>"}, follow=True)
        assert "<img src=x" not in r.content.decode()
