"""Researchers in the console: any active user logs in with the console's form; a researcher (not staff) sees only
the pages made for them (My sessions, My volumes, My credits, My API tokens) and there only their own rows. Every
other console URL, enumerated from the admin site's registry, and every other user's object answers 403 or 404 to
them, GET and POST. Then what they do on their pages: volumes, tokens shown once, credits. Through Django's test
client on the real console URLs; the browser tests are in ``test_researcher_browser.py``."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.urls import NoReverseMatch, Resolver404, URLPattern, resolve, reverse
from django.utils import timezone

from billing.models import CreditAccount, LedgerEntry, Policy, UsageSample
from billing.services import credit_grant, price_set
from console.access import OwnObjectsAdmin
from identity.keys import signing_key_ensure
from identity.models import ApiToken
from identity.tokens import api_token_create
from sessions.models import Allocation, Session
from storage.models import Volume
from tests.factories import (
    ClusterFactory,
    GpuDeviceFactory,
    NodeDiskFactory,
    SessionFactory,
    StorageCapacityReadingFactory,
    StoragePoolFactory,
    UserFactory,
    VolumeFactory,
)

pytestmark = pytest.mark.django_db

PASSWORD = "Researcher-Pa55word!"
#: URL names of the site (not of a model) a researcher may open.
SITE_PAGES_FOR_RESEARCHERS = {"index", "password_change", "password_change_done", "jsi18n"}


def _grant(user, amount: str, reason: str) -> LedgerEntry:
    return credit_grant(user=user, amount=Decimal(amount), reason=reason, idempotency_key=f"test:{uuid.uuid4().hex}",
                        created_by="test")[0]


def _own(user, tag: str, cluster, pool, device) -> dict:
    """Rows owned by ``user`` on every researcher page, with names that mark them (``tag``)."""
    volume = VolumeFactory(owner=user, pool=pool, name=f"{tag}-data", quota_gb=10)
    session = SessionFactory(owner=user, cluster=cluster, name=f"{tag}-notebook")
    Allocation.objects.create(session=session, device=device, memory_mib=1024, cores=10)
    token, _text = api_token_create(username=user.username, name=f"{tag}-laptop")
    entry = _grant(user, "100", f"{tag}-grant-reason")
    return {"volume": volume, "session": session, "token": token, "entry": entry,
            "markers": [volume.name, volume.public_id, session.public_id, token.name, token.key_id, entry.reason]}


@pytest.fixture
def world(django_user_model):
    """Two researchers (alice, bob), a staff superuser (admin), each with a volume, a session, an API token and a
    grant; and a row of every other model the console lists (so every URL with an object id has one)."""
    alice = django_user_model.objects.create_user("alice", "alice@example.test", PASSWORD)
    bob = django_user_model.objects.create_user("bob", "bob@example.test", PASSWORD)
    staff = django_user_model.objects.create_superuser("admin", "admin@example.test", PASSWORD)
    cluster = ClusterFactory(name="lab-r1")
    device = GpuDeviceFactory(node__cluster=cluster)
    pool = StoragePoolFactory(cluster=cluster, manual_capacity_gb=1024)
    rows = {name: _own(user, name, cluster, pool, device) for name, user in (("alice", alice), ("bob", bob), ("staffer", staff))}
    StorageCapacityReadingFactory(cluster=cluster)
    NodeDiskFactory(cluster=cluster)
    price_set(gpu_model="", credits_per_gpu_hour=Decimal("2"))
    Policy.objects.create(user=bob, max_sessions=3)
    signing_key_ensure()
    Group.objects.create(name="operators")
    bob_session = rows["bob"]["session"]
    now = timezone.now()
    UsageSample.objects.create(cluster=cluster, sample_id="bob-sample-1", session=bob_session, device_uuid=device.uuid,
                               start=now - timedelta(seconds=60), end=now, share=Decimal(1), cost=Decimal("0.03"))
    _ensure_beat_rows()
    try:
        from sessions.models import SuggestedImage
    except ImportError:  # not every checkout has suggested images yet
        SuggestedImage = None
    if SuggestedImage is not None:
        SuggestedImage.objects.create(image="quay.io/jupyter/base-notebook:latest")
    return {"alice": alice, "bob": bob, "staff": staff, "rows": rows, "cluster": cluster, "pool": pool, "device": device}


def _ensure_beat_rows() -> None:
    from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, SolarSchedule

    if not ClockedSchedule.objects.exists():
        ClockedSchedule.objects.create(clocked_time=timezone.now())
    if not CrontabSchedule.objects.exists():
        CrontabSchedule.objects.create()
    if not SolarSchedule.objects.exists():
        SolarSchedule.objects.create(event="sunrise", latitude=Decimal("48.1"), longitude=Decimal("11.6"))
    if not IntervalSchedule.objects.exists():
        IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)


@pytest.fixture
def as_alice(client, world):
    client.force_login(world["alice"])
    return client


def _others_markers(world) -> list[str]:
    return [m for name in ("bob", "staffer") for m in world["rows"][name]["markers"]]


def _target(model, model_admin, world, owner: str = "bob"):
    """The object a researcher's requests aim at: ``owner``'s (another researcher's: bob) on a researcher page, else
    any row."""
    if isinstance(model_admin, OwnObjectsAdmin):
        return model._default_manager.filter(**{model_admin.owner_lookup: world[owner]}).order_by("pk").first()
    return model._default_manager.order_by("pk").first()


def _reverse(pattern: URLPattern, obj) -> str:
    kwargs = {}
    for name in pattern.pattern.converters:
        if name not in ("object_id", "id", "public_id"):
            raise AssertionError(f"{pattern.name}: the test does not know what to put in <{name}>; teach _reverse")
        kwargs[name] = obj.public_id if name == "public_id" else obj.pk
    return reverse(f"admin:{pattern.name}", kwargs=kwargs)


def console_urls(world, owner: str = "bob"):
    """Every URL of every ModelAdmin in ``admin.site._registry`` (changelist, add, change, delete, history and the
    custom URLs of ``get_urls()``), aimed at :func:`_target`: ``[(model, model_admin, kind, url, target)]`` where
    ``kind`` is the URL name's suffix (``changelist``, ``change``, ``open``...)."""
    urls, missing = [], []
    for model, model_admin in admin.site._registry.items():
        target = _target(model, model_admin, world, owner)
        if target is None:
            missing.append(model._meta.label)
            continue
        prefix = f"{model._meta.app_label}_{model._meta.model_name}_"
        for pattern in model_admin.get_urls():
            if not isinstance(pattern, URLPattern) or not pattern.name:
                continue  # the unnamed <object_id>/ catch-all redirects to the change page
            kind = pattern.name.removeprefix(prefix)
            urls.append((model, model_admin, kind, _reverse(pattern, target), target))
    assert not missing, f"no row of {missing}: add one to the world fixture so their object URLs are tested"
    return urls


def _has_object(url: str) -> bool:
    return bool({"object_id", "id", "public_id"} & set(resolve(urlsplit(url).path).kwargs))


def _is_login_redirect(response) -> bool:
    return response.status_code in (301, 302) and urlsplit(response.headers.get("Location", "")).path.startswith("/login")


_HREF = re.compile(r'(?:href|action)="(/[^"#?]*)')


def _staff_links(text: str) -> list[str]:
    """Console links in ``text`` to a model page that is not a researcher's (any URL of a non-OwnObjectsAdmin model)."""
    found = []
    for path in set(_HREF.findall(text)):
        try:
            match = resolve(html.unescape(path))
        except Resolver404:
            continue
        if match.namespace != "admin" or not match.url_name:
            continue
        for model, model_admin in admin.site._registry.items():
            prefix = f"{model._meta.app_label}_{model._meta.model_name}_"
            if match.url_name.startswith(prefix) and not isinstance(model_admin, OwnObjectsAdmin):
                found.append(path)
    return sorted(found)


def _assert_researcher_page(response, world, url: str) -> None:
    """A 200 page a researcher sees: nothing of another user's, no link to a staff page."""
    text = html.unescape(response.content.decode(errors="replace"))
    leaked = [m for m in _others_markers(world) if m in text]
    assert not leaked, f"{url} shows another user's {leaked}"
    assert not _staff_links(text), f"{url} links to staff pages {_staff_links(text)}"


def _snapshot(world) -> dict:
    snap = {}
    for model in admin.site._registry:
        snap[model._meta.label] = sorted(model._default_manager.values_list("pk", flat=True))
    for name in ("bob", "staffer", "alice"):
        for key, row in world["rows"][name].items():
            if key != "markers":
                snap[f"{name}.{key}"] = type(row)._default_manager.filter(pk=row.pk).values().first()
    return snap


# --- logging in -----------------------------------------------------------------------------------------------------


def test_a_researcher_logs_in_with_the_console_form(client, world):
    response = client.post("/login/", {"username": "alice", "password": PASSWORD, "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_login_errors_do_not_speak_of_staff_and_inactive_users_stay_out(client, world):
    wrong = client.post("/login/", {"username": "alice", "password": "wrong", "next": "/"})
    assert wrong.status_code == 200
    text = wrong.content.decode()
    assert "Please enter the correct username and password" in text and "staff" not in text.lower()
    world["alice"].is_active = False
    world["alice"].save()
    inactive = client.post("/login/", {"username": "alice", "password": PASSWORD, "next": "/"})
    assert inactive.status_code == 200 and "Please enter the correct username and password" in inactive.content.decode()
    assert "staff" not in inactive.content.decode().lower()
    assert _is_login_redirect(client.get("/"))


def test_an_inactive_users_session_no_longer_opens_the_console(client, world):
    client.force_login(world["alice"])
    assert client.get("/").status_code == 200
    type(world["alice"]).objects.filter(pk=world["alice"].pk).update(is_active=False)
    assert _is_login_redirect(client.get("/"))
    assert _is_login_redirect(client.get("/storage/volume/"))


def test_anonymous_requests_go_to_the_login_page(client, world):
    for _model, _admin, _kind, url, _target in console_urls(world):
        assert _is_login_redirect(client.get(url)), url


# --- every console URL as a researcher -------------------------------------------------------------------------------


def test_every_console_url_answers_a_researcher_403_404_or_their_own_page(as_alice, world):
    own_pages, checked = [], 0
    for _model, model_admin, kind, url, _target in console_urls(world):
        response = as_alice.get(url)
        if response.status_code == 405:  # a POST-only view (Open, Stop...): judged on the method it takes
            response = as_alice.post(url, {})
        checked += 1
        assert not _is_login_redirect(response), f"{url}: a logged-in researcher is sent to the login page"
        assert response.status_code < 500, f"{url}: {response.status_code}"
        if not isinstance(model_admin, OwnObjectsAdmin):
            assert response.status_code in (403, 404), f"{url} (staff page) answered {response.status_code} to a researcher"
            continue
        if not _has_object(url):
            if kind == "add" and not model_admin.researcher_can_add:
                assert response.status_code == 403, url
            else:  # their lists, and the add and start pages they may use
                assert response.status_code == 200, f"{url} (a researcher's own page) answered {response.status_code}"
                own_pages.append(url)
                _assert_researcher_page(response, world, url)
                cl = response.context.get("cl") if response.context else None
                if cl is not None:
                    others = cl.queryset.exclude(**{model_admin.owner_lookup: world["alice"]})
                    assert not others.exists(), f"{url} lists rows of other users: {list(others[:5])}"
            continue
        # Every URL aimed at bob's object.
        assert response.status_code in (403, 404), f"{url} (another user's object) answered {response.status_code}"
    assert checked > 100
    titles = {"/storage/volume/": "My volumes", "/billing/creditaccount/": "My credits", "/gshare/apitoken/": "My API tokens"}
    for url, title in titles.items():
        assert url in own_pages
        assert f"<title>{title} |" in as_alice.get(url).content.decode(), url


def test_every_url_of_a_researchers_own_objects_shows_nothing_of_others(as_alice, world):
    for _model, model_admin, kind, url, _target in console_urls(world, owner="alice"):
        if not isinstance(model_admin, OwnObjectsAdmin) or not _has_object(url):
            continue
        response = as_alice.get(url)
        if kind in ("open", "extend", "alternative"):
            expected = 405  # POST-only (the walk above posts to them)
        elif kind == "by_id":
            expected = 302  # the "session ended" page's link: to the session's own page
        elif kind == "idle_exemption":
            expected = 403  # staff who may manage every session only (sessions.idle.session_idle_exempt)
        elif kind == "delete":
            expected = 200 if model_admin.researcher_can_delete else 403
        else:
            expected = 200
        assert response.status_code == expected, f"{url}: {response.status_code}, not {expected}"
        if response.status_code == 200:
            _assert_researcher_page(response, world, url)


def test_a_researchers_own_objects_open_read_only_where_they_may_not_change_them(as_alice, world):
    mine = world["rows"]["alice"]
    for row, base in ((mine["volume"], "/storage/volume/"), (mine["token"], "/gshare/apitoken/")):
        page = as_alice.get(f"{base}{row.pk}/change/")
        assert page.status_code == 200, base
        _assert_researcher_page(page, world, base)
        assert as_alice.get(f"{base}{row.pk}/history/").status_code == 200
        assert as_alice.get(f"{base}{row.pk}/delete/").status_code == 403
    account = CreditAccount.objects.get(user=world["alice"])
    assert as_alice.get(f"/billing/creditaccount/{account.pk}/change/").status_code == 200
    assert as_alice.post(f"/billing/creditaccount/{account.pk}/change/", {}).status_code == 403
    # A pk that does not exist and another user's look the same.
    assert as_alice.get("/storage/volume/999999/change/").status_code == 404


def test_site_pages_as_a_researcher(as_alice, world):
    """The index, the app and section pages (followed), password change, the view-on-site shortcut and autocomplete."""
    index = as_alice.get("/")
    assert index.status_code == 200
    _assert_researcher_page(index, world, "/")
    for name in SITE_PAGES_FOR_RESEARCHERS:
        response = as_alice.get(reverse(f"admin:{name}"))
        assert response.status_code == 200, name
        _assert_researcher_page(response, world, name)
    labels = {model._meta.app_label for model in admin.site._registry}
    for label in sorted(labels):
        response = as_alice.get(f"/{label}/", follow=True)
        assert not any(urlsplit(hop).path.startswith("/login") for hop, _status in response.redirect_chain), label
        assert response.status_code in (200, 403, 404), label
        if response.status_code == 200:
            _assert_researcher_page(response, world, f"/{label}/")
    for pattern in admin.site.get_urls():
        if isinstance(pattern, URLPattern) and pattern.name == "console_section":
            from console.site import SECTIONS

            for slug, _title, _models in SECTIONS:
                response = as_alice.get(f"/{slug}/")
                assert response.status_code in (200, 403, 404), slug
                if response.status_code == 200:
                    _assert_researcher_page(response, world, f"/{slug}/")
    for model, model_admin in admin.site._registry.items():
        target = _target(model, model_admin, world)
        content_type = ContentType.objects.get_for_model(model)
        try:
            url = reverse("admin:view_on_site", args=[content_type.pk, target.pk])
        except NoReverseMatch:
            break
        response = as_alice.get(url)
        assert response.status_code in (403, 404), f"{url} ({model._meta.label}): {response.status_code}"
        for field in model._meta.get_fields():
            if not getattr(field, "is_relation", False) or field.auto_created or not field.concrete:
                continue
            response = as_alice.get("/autocomplete/", {"app_label": model._meta.app_label, "model_name": model._meta.model_name,
                                                       "field_name": field.name, "term": ""})
            assert response.status_code in (200, 403, 404), (model, field.name)
            if response.status_code == 200:
                leaked = [m for m in _others_markers(world) if m in response.content.decode()]
                assert not leaked, f"autocomplete of {model._meta.label}.{field.name} shows {leaked}"


def test_posts_to_other_users_objects_and_staff_pages_are_refused_and_change_nothing(as_alice, world):
    before = _snapshot(world)
    for _model, model_admin, kind, url, target in console_urls(world):
        own_page = isinstance(model_admin, OwnObjectsAdmin)
        if kind == "changelist":
            actions = [*(a if isinstance(a, str) else a.__name__ for a in model_admin.actions or []), "delete_selected"]
            for action in actions:
                response = as_alice.post(url, {"action": action, ACTION_CHECKBOX_NAME: [target.pk], "index": 0, "post": "yes",
                                               "apply": "1", "amount": "5", "reason": "x", "idempotency_key": "k"})
                assert response.status_code in (403, 404), f"POST {url} action {action} on {target!r}: {response.status_code}"
            continue
        if kind == "add":
            if not (own_page and model_admin.researcher_can_add):
                assert as_alice.post(url, {}).status_code == 403, url
            continue
        if not _has_object(url):
            continue  # a page of their own without an object (e.g. Start session): tested on its own
        response = as_alice.post(url, {"post": "yes", "quota_gb": 500, "name": "x"})
        if response.status_code == 405:  # a GET-only view: judged by the GET test
            continue
        assert response.status_code in (403, 404), f"POST {url} ({'bob' if own_page else 'staff'} object): {response.status_code}"
    # On their own rows, the staff-only actions (delete_selected, grant credits) stay refused.
    for url, row, action in (("/storage/volume/", world["rows"]["alice"]["volume"], "delete_selected"),
                             ("/gshare/apitoken/", world["rows"]["alice"]["token"], "delete_selected"),
                             ("/billing/creditaccount/", CreditAccount.objects.get(user=world["alice"]), "grant_credits")):
        response = as_alice.post(url, {"action": action, ACTION_CHECKBOX_NAME: [row.pk], "index": 0, "post": "yes"})
        assert response.status_code == 403, (url, action)
    assert _snapshot(world) == before


# --- My volumes -------------------------------------------------------------------------------------------------------


def test_my_volumes_create_resize_delete_through_the_services(as_alice, world):
    add = as_alice.get("/storage/volume/add/")
    assert add.status_code == 200 and 'name="owner"' not in add.content.decode()
    created = as_alice.post("/storage/volume/add/", {"name": "results", "quota_gb": 20, "storage_pool": "", "mount_cluster": ""})
    assert created.status_code == 302, created.content.decode()[:3000]
    volume = Volume.objects.get(name="results")
    assert volume.owner == world["alice"] and volume.pool == world["pool"] and volume.quota_gb == 20
    # The service's refusals come back on the form, nothing created: a name taken, a pool too small.
    taken = as_alice.post("/storage/volume/add/", {"name": "results", "quota_gb": 1})
    assert taken.status_code == 200 and "errorlist" in taken.content.decode()
    assert Volume.objects.filter(name="results").count() == 1
    full = as_alice.post("/storage/volume/add/", {"name": "huge", "quota_gb": 100000})
    assert full.status_code == 200 and "errorlist" in full.content.decode() and not Volume.objects.filter(name="huge").exists()
    bad = as_alice.post("/storage/volume/add/", {"name": "Not_A_Label", "quota_gb": 1})
    assert bad.status_code == 200 and not Volume.objects.filter(name="Not_A_Label").exists()
    # Resize within the pool: grows; past the pool or shrinking is refused on the form.
    assert as_alice.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": 30}).status_code == 302
    assert Volume.objects.get(pk=volume.pk).quota_gb == 30
    for quota in (5, 100000):
        page = as_alice.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": quota})
        assert page.status_code == 200 and "errorlist" in page.content.decode()
    assert Volume.objects.get(pk=volume.pk).quota_gb == 30
    # Delete when unused; refused while a live session mounts it.
    mounted = world["rows"]["alice"]["volume"]
    world["rows"]["alice"]["session"].volumes.set([mounted])
    refused = as_alice.post("/storage/volume/", {"action": "delete_volumes", ACTION_CHECKBOX_NAME: [mounted.pk], "index": 0}, follow=True)
    assert "mounted by session" in refused.content.decode() and Volume.objects.get(pk=mounted.pk).status != Volume.Status.DELETED
    deleted = as_alice.post("/storage/volume/", {"action": "delete_volumes", ACTION_CHECKBOX_NAME: [volume.pk], "index": 0}, follow=True)
    assert deleted.status_code == 200 and Volume.objects.get(pk=volume.pk).status == Volume.Status.DELETED


def test_my_volumes_lists_only_mine_without_owner_or_fleet_filters(as_alice, world):
    page = as_alice.get("/storage/volume/")
    assert [v.owner for v in page.context["cl"].result_list] == [world["alice"]]
    text = page.content.decode()
    assert "My volumes" in text and "alice-data" in text and "bob-data" not in text
    assert "cluster__id__exact" not in text and "pool__id__exact" not in text


# --- My API tokens ----------------------------------------------------------------------------------------------------


def test_my_api_tokens_shown_once_then_never_again(as_alice, world, http_for, caplog):
    caplog.set_level("DEBUG")
    form = as_alice.get("/gshare/apitoken/add/").content.decode()
    assert "<title>Create API token |" in form and 'name="_save"' in form
    assert 'name="_addanother"' not in form and 'name="_continue"' not in form
    # Whatever button was pressed, the next page is the one that shows the token.
    created = as_alice.post("/gshare/apitoken/add/", {"name": "notebook-client", "_continue": "1"})
    assert created.status_code == 302
    row = ApiToken.objects.get(name="notebook-client")
    assert row.user == world["alice"] and created["Location"] == f"/gshare/apitoken/{row.pk}/created/"
    first = as_alice.get(created["Location"])
    assert first.status_code == 200 and "no-store" in first["Cache-Control"]
    text = re.search(r'id="api-token-text"[^>]*value="(gsh_[^"]+)"', first.content.decode()).group(1)
    assert text.startswith(f"gsh_{row.key_id}_")
    again = as_alice.get(created["Location"])
    assert again.status_code == 200 and text not in again.content.decode() and "shown once" in again.content.decode()
    assert text not in as_alice.get("/gshare/apitoken/").content.decode()
    assert text not in caplog.text
    assert text not in str(list(as_alice.session.items()))
    # The token works as a bearer token, as alice.
    assert http_for(text).get("/api/v1/billing/account").status_code == 200
    # Staff keep the list of every user's tokens.
    as_alice.force_login(world["staff"])
    staff_list = as_alice.get("/gshare/apitoken/").content.decode()
    assert "notebook-client" in staff_list and "bob-laptop" in staff_list and "alice-laptop" in staff_list


def test_my_api_tokens_revoke_mine_not_others(as_alice, world):
    mine, bobs = world["rows"]["alice"]["token"], world["rows"]["bob"]["token"]
    response = as_alice.post("/gshare/apitoken/", {"action": "revoke", ACTION_CHECKBOX_NAME: [mine.pk], "index": 0})
    assert response.status_code == 302
    mine.refresh_from_db()
    assert mine.revoked_at is not None
    response = as_alice.post("/gshare/apitoken/", {"action": "revoke", ACTION_CHECKBOX_NAME: [mine.pk, bobs.pk], "index": 0})
    assert response.status_code == 404
    bobs.refresh_from_db()
    assert bobs.revoked_at is None
    assert as_alice.get(f"/gshare/apitoken/{bobs.pk}/created/").status_code == 404


# --- My credits -------------------------------------------------------------------------------------------------------


def test_my_credits_shows_balance_holds_burn_and_my_ledger(as_alice, world, django_assert_max_num_queries):
    _grant(world["alice"], "25.5", "alice-second-grant")
    with django_assert_max_num_queries(30):
        page = as_alice.get("/billing/creditaccount/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "My credits" in text
    assert 'id="my-balance" title="125.500000">125.50<' in text
    assert "alice-grant-reason" in text and "alice-second-grant" in text and "bob-grant-reason" not in text
    assert "per hour" in text and "Held by live sessions" in text and " UTC" in text
    _assert_researcher_page(page, world, "/billing/creditaccount/")


def test_my_credits_shows_the_price_list_and_the_runway_as_a_person_reads_them(as_alice, world):
    from sessions.models import Session

    Session.objects.filter(pk=world["rows"]["alice"]["session"].pk).update(phase="Running")
    device = world["rows"]["alice"]["session"].allocations.get().device
    text = as_alice.get("/billing/creditaccount/").content.decode()
    # One GPU model in the fleet, priced by the default row (2 credits per GPU-hour).
    assert f"<td>{device.model}</td>" in text and '<td title="2.000000">2.00 (default price)</td>' in text
    assert "<td>1 of 1</td>" in text  # the GPU's counters show no reservation: free
    # alice's Running session is the burn (its share of the GPU at 2 credits per GPU-hour), and it sets the runway.
    from billing.selectors import session_hourly_cost
    from console.figures import credits_display

    burn = session_hourly_cost(world["rows"]["alice"]["session"])
    assert burn > 0 and f'id="my-burn" title="{burn}">{credits_display(burn)} per hour' in text
    assert "at this rate your credits last until " in text


def test_credits_are_shown_with_the_precision_a_person_needs():
    from console.figures import credits_display

    cases = {"1234.5": "1,234.50", "-3": "-3.00", "0.613052": "0.61", "0.0035": "0.0035", "0.000001": "0.000001",
             "0": "0.00", "1000.000000": "1,000.00", "-0.004444": "-0.0044", "": "", "n/a": "n/a"}
    assert {value: credits_display(value) for value in cases} == cases
    assert credits_display(None) == ""


def test_your_limits_show_the_idle_timeout(as_alice, world):
    Policy.objects.create(user=world["alice"], idle_timeout_minutes=45, idle_warning_minutes=10)
    text = as_alice.get("/billing/creditaccount/").content.decode()
    assert ('id="my-idle-timeout">a session is stopped after 45 min without a GPU kernel '
            "(you are warned 10 min before; an open browser tab does not keep it)<") in text
    assert 'id="my-max-volume">500 GiB<' in text  # the default per-user total of volumes
    Policy.objects.filter(user=world["alice"]).update(idle_timeout_minutes=0)
    text = as_alice.get("/billing/creditaccount/").content.decode()
    assert 'id="my-idle-timeout">none: idle sessions are not stopped<' in text


def test_your_limits_show_the_time_limit(as_alice, world):
    text = as_alice.get("/billing/creditaccount/").content.decode()
    assert ('id="my-time-limit">a session may run at most 24 hours from when it is started (ask for less when you start it; you '
            "are warned 15 min before its end and may extend it up to this limit)<") in text
    Policy.objects.create(user=world["alice"], max_runtime_hours=Decimal("1.5"), runtime_warning_minutes=5)
    text = as_alice.get("/billing/creditaccount/").content.decode()
    assert "at most 1.50 hours" in text and "warned 5 min before" in text
    Policy.objects.filter(user=world["alice"]).update(max_runtime_hours=0)
    text = as_alice.get("/billing/creditaccount/").content.decode()
    assert 'id="my-time-limit">none: sessions run until stopped<' in text


def test_my_credits_page_queries_do_not_grow_with_ledger_entries(as_alice, world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for _ in range(2):
        for i in range(20):
            _grant(world["alice"], "1", f"bulk-{i}")
        with CaptureQueriesContext(connection) as queries:
            assert as_alice.get("/billing/creditaccount/").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_a_researcher_without_an_account_sees_zero(client, world):
    carol = UserFactory(username="carol")
    carol.set_password(PASSWORD)
    carol.save()
    client.force_login(carol)
    page = client.get("/billing/creditaccount/")
    assert page.status_code == 200 and 'id="my-balance" title="0.000000">0.00<' in page.content.decode()
    assert not CreditAccount.objects.filter(user=carol).exists()


def test_session_rows_of_others_are_not_in_my_sessions(as_alice, world):
    page = as_alice.get("/gpu_sessions/session/")
    assert page.status_code == 200
    assert {s.owner_id for s in page.context["cl"].queryset} == {world["alice"].pk}
    assert Session.objects.filter(owner=world["bob"]).exists()


@pytest.mark.parametrize("path", ["/storage/volume/", "/gshare/apitoken/", "/gpu_sessions/session/"])
def test_my_lists_queries_do_not_grow_with_rows(as_alice, world, path):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for batch in range(2):
        for i in range(10):
            tag = f"more-{batch}-{i}"
            VolumeFactory(owner=world["alice"], pool=world["pool"], name=tag)
            api_token_create(username="alice", name=tag)
            SessionFactory(owner=world["alice"], cluster=world["cluster"], name=tag)
        with CaptureQueriesContext(connection) as queries:
            assert as_alice.get(path).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
