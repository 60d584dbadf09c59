"""The console's session pages through Django's test client: the list's columns (cost so far from the ledger), Open
(a connect link at the session's own cluster host), Stop, the Start session form (success, each refusal with its
code, a double submit), researchers' My sessions (their own only), and bounded queries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import services as billing
from billing.models import CreditAccount, LedgerEntry, Policy, Price
from clusters.models import Cluster, GpuDevice
from console.pages.sessions import selectors as console_selectors
from sessions import placement
from sessions.models import Allocation, Session, SuggestedImage
from tests.console_checks import page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory, VolumeFactory

pytestmark = pytest.mark.django_db

LIST = "/gpu_sessions/session/"
START = "/gpu_sessions/session/start/"


def fleet(gpus: int = 4, **cluster) -> Cluster:
    """A connected cluster with one node of ``gpus`` H100s (rows only: nothing dials it in these tests)."""
    cluster = ClusterFactory(**cluster)
    node = NodeFactory(cluster=cluster)
    for index in range(gpus):
        GpuDeviceFactory(node=node, cluster=cluster, index=index)
    placement.usage_recompute(cluster_ids=[cluster.pk])  # rows made by factories, not by inventory_apply
    return cluster


def grant(user, amount: str = "1000") -> None:
    """Give ``user`` credits through the billing service."""
    billing.credit_grant(user=user, amount=Decimal(amount), reason="test", idempotency_key=f"grant-{uuid.uuid4()}", created_by="test")


def charge(session: Session, amount: str, kind: str = LedgerEntry.Kind.CHARGE) -> None:
    """A ledger entry of ``session`` (a charge is negative, a refund positive) through the billing service."""
    account, _ = CreditAccount.objects.get_or_create(user=session.owner)
    billing.ledger_append(account=account, kind=kind, amount=Decimal(amount), idempotency_key=f"e-{uuid.uuid4()}", session=session,
                          created_by="test")


def start_form(**fields) -> dict:
    """The Start session form's POST data (whole GPU, automatic cluster, a fresh idempotency key) with ``fields``."""
    data = {"image": "quay.io/jupyter/base-notebook", "name": "", "gpus": "1", "share": "whole", "gpu_memory_mib": "",
            "gpu_cores": "", "cluster": "", "idempotency_key": uuid.uuid4().hex}
    data.update(fields)
    return data


# --- the list -------------------------------------------------------------------------------------------------------

def test_list_shows_phase_owner_cluster_node_gpus_started_cost_and_url(console):
    cluster = fleet(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    started = datetime(2026, 12, 1, 9, 30, 5, tzinfo=UTC)
    session = SessionFactory(cluster=cluster, node="gpu-node-a", gpus=2, gpu_memory_mib=4000, gpu_cores=25, started_at=started,
                             owner=UserFactory(username="bob"))
    grant(session.owner)
    charge(session, "-12.250000")
    charge(session, "-0.000125")
    charge(session, "1.000000", kind=LedgerEntry.Kind.REFUND)
    other = SessionFactory(cluster=cluster, phase=Session.Phase.STARTING)
    charge(other, "-3")

    assert console_selectors.cost_so_far(session) == Decimal("11.250125")
    costs = dict(console_selectors.with_cost_so_far(Session.objects.all()).values_list("public_id", "cost_so_far"))
    assert costs == {session.public_id: Decimal("11.250125"), other.public_id: Decimal("3")}
    assert isinstance(costs[session.public_id], Decimal)

    text = page_text(console.get(LIST))
    assert '<span class="gs-phase gs-phase-running" data-phase="Running">Running</span>' in text
    assert '<span class="gs-phase gs-phase-starting" data-phase="Starting">Starting</span>' in text
    # The cost as a person reads it (two decimals), the exact figure on hover.
    for expected in ("bob", "lab-c1", "gpu-node-a", "2 × 4000 MiB, 25% cores", "2026-12-01</span> <span class=\"gs-time\">09:30:05 UTC",
                     '<span class="gs-credits" title="11.250125 credits">11.25</span>',
                     f'href="https://lab-c1.gshare.localhost/s/{session.public_id}/"', "Cost so far"):
        assert expected in text, expected
    # Open only for the Running one; Stop for both (live, not stopping); the bulk Stop action stays.
    assert text.count(f'formaction="/gpu_sessions/session/{session.pk}/open/"') == 1
    assert f'formaction="/gpu_sessions/session/{other.pk}/open/"' not in text
    assert f'formaction="/gpu_sessions/session/{other.pk}/stop/"' in text
    assert 'value="stop"' in text and "Start session" in text


def test_the_session_page_shows_what_a_live_session_costs_per_hour(console):
    from billing.models import Price
    from billing.selectors import session_hourly_cost
    from sessions.models import Allocation

    cluster = fleet(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    session = SessionFactory(cluster=cluster, phase=Session.Phase.RUNNING, gpus=1)
    gpu = cluster.devices.order_by("pk").first()
    Price.objects.create(gpu_model=gpu.model, credits_per_gpu_hour=Decimal("3.456789"))
    Allocation.objects.create(session=session, device=gpu, memory_mib=gpu.memory_mib, cores=100, exclusive=True)
    assert session_hourly_cost(session) == Decimal("3.456789")
    text = page_text(console.get(f"{LIST}{session.pk}/change/"))
    assert '<span class="gs-credits" id="session-rate" title="3.456789 credits per hour">3.46 per hour</span>' in text
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.TERMINATED)
    assert 'id="session-rate"' not in page_text(console.get(f"{LIST}{session.pk}/change/"))


def test_list_narrows_to_the_console_cluster(console):
    one, two = fleet(name="lab-c1"), fleet(name="lab-c2")
    here, there = SessionFactory(cluster=one), SessionFactory(cluster=two)
    console.get(f"{LIST}?cluster=lab-c2")
    text = page_text(console.get(LIST))
    assert there.public_id in text and here.public_id not in text
    # A session page of another cluster still opens.
    assert console.get(f"{LIST}{here.pk}/change/").status_code == 200


def test_list_queries_do_not_grow_with_rows(console, django_assert_max_num_queries):
    cluster = fleet(gpus=1)
    owner = UserFactory()
    grant(owner)

    def add(count: int) -> None:
        sessions = Session.objects.bulk_create([Session(owner=owner, cluster=cluster, image="img", gpus=1, phase="Running")
                                                for _ in range(count)])
        account = CreditAccount.objects.get(user=owner)
        LedgerEntry.objects.bulk_create([
            LedgerEntry(account=account, kind="charge", amount=Decimal("-1"), balance_after=Decimal(0), idempotency_key=f"q-{s.pk}",
                        session=s) for s in sessions
        ])

    counts = []
    for total in (10, 500):
        add(total - Session.objects.count())
        with CaptureQueriesContext(connection) as queries:
            response = console.get(LIST)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    with django_assert_max_num_queries(counts[0]):
        console.get(LIST)


# --- Open and Stop --------------------------------------------------------------------------------------------------

def test_open_redirects_to_a_connect_link_on_the_sessions_cluster_host(console, staff_user):
    cluster = fleet(name="lab-c3", session_domain="lab-c3.gshare.localhost")
    session = SessionFactory(cluster=cluster)
    response = console.post(f"{LIST}{session.pk}/open/", {"next": LIST})
    assert response.status_code == 302
    link = urlsplit(response["Location"])
    assert link.hostname == "lab-c3.gshare.localhost" and link.path == f"/s/{session.public_id}/"
    assert parse_qs(link.query)["token"][0].count(".") == 2  # a JWT
    assert "no-store" in response["Cache-Control"]
    assert console.get(f"{LIST}{session.pk}/open/").status_code == 405


@pytest.mark.parametrize("phase", [Session.Phase.TERMINATED, Session.Phase.FAILED])
def test_open_is_refused_for_an_ended_session_with_a_clear_message(console, phase):
    session = SessionFactory(cluster=fleet(), phase=phase)
    response = console.post(f"{LIST}{session.pk}/open/", follow=True)
    assert response.redirect_chain[-1][0] == f"{LIST}{session.pk}/change/"
    text = page_text(response)
    assert f"Cannot open {session.public_id} (session_not_running): Session {session.public_id} is {phase}: start a new session." in text
    assert "/open/" not in text  # no Open button on an ended session's page


def test_stop_from_the_row_and_from_the_session_page(console):
    cluster = fleet()
    one, two = SessionFactory(cluster=cluster), SessionFactory(cluster=cluster)
    response = console.post(f"{LIST}{one.pk}/stop/", {"next": LIST, "post": "yes"}, follow=True)
    assert response.redirect_chain[-1][0] == LIST
    assert f"Session {one.public_id} is Stopping." in page_text(response)
    page = page_text(console.get(f"{LIST}{two.pk}/change/"))
    assert f'action="/gpu_sessions/session/{two.pk}/stop/"' in page and f'action="/gpu_sessions/session/{two.pk}/open/"' in page
    assert 'class="submit-row"' not in page  # still a read-only record
    console.post(f"{LIST}{two.pk}/stop/", {"post": "yes"})
    assert set(Session.objects.values_list("phase", flat=True)) == {Session.Phase.STOPPING}
    # Stopping: no Stop button any more, and the page follows it until it ends.
    page = page_text(console.get(f"{LIST}{two.pk}/change/"))
    assert "/stop/" not in page and f'data-gs-follow="/gpu_sessions/session/{two.pk}/status/"' in page


def test_stop_needs_the_change_permission_for_staff(client, django_user_model):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_session"))
    client.force_login(viewer)
    session = SessionFactory(cluster=fleet())
    assert client.post(f"{LIST}{session.pk}/stop/").status_code == 403
    assert "/stop/" not in page_text(client.get(LIST))
    assert client.get(START).status_code == 403  # starting needs add_session
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING


def test_status_endpoint_is_what_the_page_follows(console):
    session = SessionFactory(cluster=fleet(name="lab-c9", session_domain="lab-c9.gshare.localhost"), phase=Session.Phase.STARTING,
                             message="pulling image")
    body = console.get(f"{LIST}{session.pk}/status/").json()
    assert body == {"id": session.public_id, "phase": "Starting", "message": "pulling image", "node": "",
                    "url": f"https://lab-c9.gshare.localhost/s/{session.public_id}/", "started_at": "", "ended_at": "",
                    "follow": True, "can_open": False, "can_stop": True, "queue_position": None, "estimated_start": "",
                    "waiting_for": ""}
    assert console.get(f"{LIST}999999/status/").status_code == 404


# --- the Start session form -----------------------------------------------------------------------------------------

def test_start_form_offers_suggested_images_clusters_and_own_volumes(console, staff_user):
    SuggestedImage.objects.create(image="registry.example/lab/notebook:1", description="the lab's notebook")
    fleet(name="lab-c1")
    fleet(name="gone", status=Cluster.Status.DEREGISTERED)
    VolumeFactory(owner=staff_user, name="mine")
    VolumeFactory(name="theirs")
    text = page_text(console.get(START))
    assert '<datalist id="gs-suggested-images">' in text and 'list="gs-suggested-images"' in text
    assert '<option value="registry.example/lab/notebook:1">the lab&#x27;s notebook</option>' in text or \
        '<option value="registry.example/lab/notebook:1">the lab\'s notebook</option>' in text
    assert "quay.io/jupyter/base-notebook" in text  # the migration's first suggestions
    assert ">Automatic<" in text and "lab-c1: connected" in text and "gone" not in text
    assert "mine (10 GiB)" in text and "theirs" not in text
    assert 'name="idempotency_key"' in text


def test_start_form_starts_a_session_and_goes_to_its_page(console, staff_user):
    cluster = fleet(name="lab-c1")
    volume = VolumeFactory(owner=staff_user, name="data")
    grant(staff_user)
    response = console.post(START, start_form(cluster=cluster.public_id, share="share", gpu_memory_mib="4000", gpu_cores="25",
                                              volumes=[volume.public_id], name="nb"))
    session = Session.objects.get()
    assert response.status_code == 302 and response["Location"] == f"{LIST}{session.pk}/change/"
    assert (session.owner, session.cluster, session.requested_cluster, session.gpus, session.gpu_memory_mib, session.gpu_cores,
            session.name, session.phase) == (staff_user, cluster, cluster, 1, 4000, 25, "nb", Session.Phase.SCHEDULED)
    assert list(session.volumes.all()) == [volume]
    page = page_text(console.get(response["Location"]))
    assert f'data-gs-follow="/gpu_sessions/session/{session.pk}/status/"' in page and "following this session" in page
    assert "/open/" not in page  # not Running yet


def test_whole_gpus_ignore_the_share_fields(console, staff_user):
    fleet()
    grant(staff_user)
    console.post(START, start_form(share="whole", gpu_memory_mib="4000", gpu_cores="25", gpus="2"))
    session = Session.objects.get()
    assert (session.gpus, session.gpu_memory_mib, session.gpu_cores, session.whole_gpus) == (2, None, None, True)


def test_double_submit_starts_one_session(console, staff_user):
    fleet()
    grant(staff_user)
    data = start_form()
    first, second = console.post(START, data), console.post(START, data)
    assert Session.objects.count() == 1
    assert first["Location"] == second["Location"] == f"{LIST}{Session.objects.get().pk}/change/"


def _refused(console, data, code: str, status: int, sentence: str) -> str:
    response = console.post(START, data)
    assert response.status_code == 200, response
    text = page_text(response)
    assert f'<code class="gs-refusal-code">{code}</code> (HTTP {status})' in text, text[:3000]
    assert sentence in text and "Nothing was started." in text
    assert "DELETE /api/v1/sessions" not in text  # the console names its Stop button, not the API call
    assert Session.objects.count() == 0
    return text


def test_refusal_no_credits(console, settings):
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = Decimal(1)  # the production default (tests run with 0)
    fleet()
    _refused(console, start_form(), "insufficient_credits", 402, "stop a session (the Stop button on its page under My sessions)")


def test_refusal_over_the_policy(console, staff_user):
    Policy.objects.create(user=staff_user, max_gpus=1)
    fleet()
    _refused(console, start_form(gpus="2"), "quota_exceeded", 403, "stop a session (the Stop button on its page under My sessions)")


def test_refusal_over_the_session_limit_names_the_stop_button(console, staff_user):
    """The API's sentence names ``DELETE /api/v1/sessions/{id}``; the console's names the button that does it."""
    Policy.objects.create(user=staff_user, max_sessions=0)
    fleet()
    _refused(console, start_form(), "quota_exceeded", 403, "stop one (the Stop button on its page under My sessions)")


@pytest.mark.parametrize(("share", "sentence"), [
    ({"gpu_cores": "150"}, "gpu_cores must be a percentage of one GPU from 1 to 100"),
    ({"gpu_cores": "0"}, "gpu_cores must be a percentage of one GPU from 1 to 100"),
    ({"gpu_memory_mib": "-5"}, "gpu_memory_mib must be a positive number of MiB per GPU"),
])
def test_refusal_bad_share_values(console, staff_user, share, sentence):
    fleet()
    grant(staff_user)
    _refused(console, start_form(share="share", **share), "invalid_request", 400, sentence)


def test_refusal_bad_gpu_count(console, staff_user):
    fleet()
    grant(staff_user)
    _refused(console, start_form(gpus="17"), "invalid_request", 400, "gpus must be a whole number from 1 to 16")


def test_share_without_memory_or_cores_is_a_form_error(console, staff_user):
    fleet()
    grant(staff_user)
    text = page_text(console.post(START, start_form(share="share")))
    assert "A share needs GPU memory (MiB), GPU cores (%), or both" in text and Session.objects.count() == 0


def test_refusal_unknown_cluster(console, staff_user):
    fleet()
    grant(staff_user)
    _refused(console, start_form(cluster="clu_doesnotexist"), "cluster_not_found", 404, "No cluster is named or has the id")


@pytest.mark.parametrize("status", [Cluster.Status.UNREACHABLE, Cluster.Status.PENDING])
def test_refusal_unavailable_cluster(console, staff_user, status):
    fleet()
    cluster = fleet(name="lab-down", status=status)
    grant(staff_user)
    text = _refused(console, start_form(cluster=cluster.public_id), "cluster_unavailable", 409, "Cluster lab-down is")
    assert f"lab-down: {status}" in text  # still listed, with its status


def test_refusal_someone_elses_volume(console, staff_user):
    fleet()
    grant(staff_user)
    theirs = VolumeFactory(name="theirs")
    _refused(console, start_form(volumes=[theirs.public_id]), "volume_not_found", 404, f"No volume '{theirs.public_id}' of yours")


def test_refusal_no_capacity(console, staff_user):
    fleet(gpus=1)
    grant(staff_user, "100000")
    _refused(console, start_form(gpus="2"), "no_capacity", 409, "Nothing in")


# --- researchers: My sessions ---------------------------------------------------------------------------------------

def test_researcher_sees_only_their_own_sessions(researcher_console, plain_user):
    cluster = fleet()
    mine, theirs = SessionFactory(cluster=cluster, owner=plain_user), SessionFactory(cluster=cluster)
    response = researcher_console.get(LIST)
    assert response.status_code == 200
    text = page_text(response)
    assert "My sessions" in text and mine.public_id in text and theirs.public_id not in text
    assert f"/{mine.pk}/stop/" in text and f"/{mine.pk}/open/" in text and "Start session" in text
    page = researcher_console.get(f"{LIST}{mine.pk}/change/")
    assert page.status_code == 200
    # No link to a staff page (the user's, the cluster's): those answer 403 to a researcher.
    assert "/auth/user/" not in page_text(page) and "/clusters/cluster/" not in page_text(page)
    assert researcher_console.get(f"{LIST}{theirs.pk}/change/").status_code == 404
    assert researcher_console.get(f"{LIST}{theirs.pk}/status/").status_code == 404


def test_researcher_cannot_stop_or_open_another_users_session(researcher_console, plain_user):
    theirs = SessionFactory(cluster=fleet())
    assert researcher_console.post(f"{LIST}{theirs.pk}/stop/").status_code == 404
    assert researcher_console.post(f"{LIST}{theirs.pk}/open/").status_code == 404
    assert researcher_console.post(LIST, {"action": "stop", "_selected_action": [theirs.pk], "index": 0}).status_code in (403, 404)
    assert Session.objects.get(pk=theirs.pk).phase == Session.Phase.RUNNING


def test_researcher_starts_opens_and_stops_their_own(researcher_console, plain_user):
    cluster = fleet(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    grant(plain_user)
    assert "mine" not in page_text(researcher_console.get(START))
    response = researcher_console.post(START, start_form(cluster="lab-c1"))
    session = Session.objects.get()
    assert session.owner == plain_user and response["Location"] == f"{LIST}{session.pk}/change/"
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.RUNNING)
    link = urlsplit(researcher_console.post(f"{LIST}{session.pk}/open/")["Location"])
    assert link.hostname == cluster.session_domain
    researcher_console.post(f"{LIST}{session.pk}/stop/", {"post": "yes"})
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.STOPPING


def test_researcher_list_queries_do_not_grow_with_rows(researcher_console, plain_user):
    cluster = fleet(gpus=1)
    counts = []
    for total in (10, 500):
        Session.objects.bulk_create([Session(owner=plain_user, cluster=cluster, image="img", gpus=1, phase="Running")
                                     for _ in range(total - Session.objects.count())])
        with CaptureQueriesContext(connection) as queries:
            assert researcher_console.get(LIST).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("fields", [
    {"volumes": ["vol_\x00"]}, {"volumes": ["v" * 65]}, {"image": "a\x00b"}, {"cluster": "lab\x00"},
    {"idempotency_key": "k\x00"}, {"share": "share", "gpu_memory_mib": str(2**63)}, {"gpus": "1e3"}, {"share": "half"},
])
def test_malformed_form_input_is_a_form_error_never_a_500(console, staff_user, fields):
    fleet()
    grant(staff_user)
    response = console.post(START, start_form(**fields))
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert Session.objects.count() == 0


def test_open_and_stop_of_a_missing_or_malformed_id_answer_404(console):
    for object_id in ("999999", "abc", "%00"):
        expected = (400, 404) if object_id == "%00" else (404,)  # a NUL in the path is refused before the console
        assert console.post(f"{LIST}{object_id}/open/").status_code in expected
        assert console.post(f"{LIST}{object_id}/stop/").status_code in expected
        assert console.get(f"{LIST}{object_id}/status/").status_code in expected


def test_stop_goes_back_to_the_console_only(console):
    session = SessionFactory(cluster=fleet())
    confirmation = page_text(console.post(f"{LIST}{session.pk}/stop/", {"next": "https://evil.example/"}))
    assert "evil.example" not in confirmation  # neither the posted next nor the link back
    response = console.post(f"{LIST}{session.pk}/stop/", {"next": "https://evil.example/", "post": "yes"})
    assert response["Location"] == f"{LIST}{session.pk}/change/"


def test_staff_keep_the_suggested_images(console):
    assert console.get("/gpu_sessions/suggestedimage/").status_code == 200
    response = console.post("/gpu_sessions/suggestedimage/add/", {"image": "registry.example/lab/nb:2", "description": "lab", "position": 5})
    assert response.status_code == 302 and SuggestedImage.objects.filter(image="registry.example/lab/nb:2").exists()
    assert "registry.example/lab/nb:2" in page_text(console.get(START))


def test_researchers_cannot_reach_the_suggested_images(researcher_console):
    assert researcher_console.get("/gpu_sessions/suggestedimage/").status_code == 403
    assert researcher_console.get("/gpu_sessions/suggestedimage/add/").status_code == 403


def test_the_allocations_block_names_each_gpu_without_a_header_of_internal_ids(console):
    cluster = fleet(gpus=2)
    session = SessionFactory(cluster=cluster)
    devices = list(GpuDevice.objects.filter(cluster=cluster).order_by("index"))
    for device in devices:
        Allocation.objects.create(session=session, device=device, memory_mib=4096, cores=30)
    text = page_text(console.get(f"{LIST}{session.pk}/change/"))
    block = text.split('id="allocations-group"')[1].split("</fieldset>")[0]
    for device in devices:
        assert f"{session.pk} on {device.pk}" not in text  # Allocation.__str__: the pks Django's tabular inline printed
        assert str(device) in block
    assert 'class="original"' not in block
    assert block.count('<tr class="form-row"') == 2 and block.count("4096") == 2


def test_stop_asks_for_confirmation_and_says_what_an_8_gpu_session_loses(console, staff_user):
    cluster = fleet(gpus=8)
    session = SessionFactory(cluster=cluster, gpus=8, name="big-run", started_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC))
    session.volumes.add(VolumeFactory(owner=session.owner, name="checkpoints"))
    # The row's and the page's Stop buttons post without the confirmation: the confirmation page, nothing stopped.
    page = console.post(f"{LIST}{session.pk}/stop/", {"next": LIST})
    assert page.status_code == 200
    text = page_text(page)
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING
    assert "The <strong>8 GPUs</strong> go back to the fleet" in text and "is lost" in text
    assert f"{session.public_id}</strong> (big-run): Running, 8 whole GPUs, running since 2026-12-01 09:30:00 UTC; kept: checkpoints" in text
    form = text.split('id="gs-stop-form"')[1].split("</form>")[0]
    assert '<input type="hidden" name="post" value="yes">' in form and f'name="next" value="{LIST}"' in form
    assert f'href="{LIST}" class="button cancel-link">No, take me back' in form  # back without JavaScript
    # A GET (the URL typed, or a link) asks too, and takes back to the session's page.
    text = page_text(console.get(f"{LIST}{session.pk}/stop/"))
    assert f'href="{LIST}{session.pk}/change/" class="button cancel-link"' in text
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING
    # Another value than "yes" is no confirmation.
    assert console.post(f"{LIST}{session.pk}/stop/", {"post": "1"}).status_code == 200
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING
    response = console.post(f"{LIST}{session.pk}/stop/", {"next": LIST, "post": "yes"}, follow=True)
    assert response.redirect_chain[-1][0] == LIST and f"Session {session.public_id} is Stopping." in page_text(response)
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.STOPPING
    # Once stopping, the page says nothing is lost any more.
    assert "Nothing is running any more" in page_text(console.get(f"{LIST}{session.pk}/stop/"))


def test_the_bulk_stop_action_asks_for_confirmation_first(console):
    cluster = fleet()
    one, two = SessionFactory(cluster=cluster, gpus=2), SessionFactory(cluster=cluster, gpus=1)
    action = {"action": "stop", "_selected_action": [str(one.pk), str(two.pk)], "index": "0"}
    page = console.post(LIST, action)
    assert page.status_code == 200
    text = page_text(page)
    assert "Stop 2 sessions?" in text and "The <strong>3 GPUs</strong> go back" in text and "no volume: nothing of it is kept" in text
    assert set(Session.objects.values_list("phase", flat=True)) == {Session.Phase.RUNNING}
    form = text.split('id="gs-stop-form"')[1].split("</form>")[0]
    assert f'name="_selected_action" value="{one.pk}"' in form and f'name="_selected_action" value="{two.pk}"' in form
    response = console.post(LIST, {**action, "post": "yes"}, follow=True)
    assert "2 session(s) stopping" in page_text(response)
    assert set(Session.objects.values_list("phase", flat=True)) == {Session.Phase.STOPPING}


# --- GPU models on the Start session form ---------------------------------------------------------------------------

def two_models() -> tuple[Cluster, Cluster]:
    """lab-c1: 4 × H100 (the factory's model), lab-c2: 2 × Tesla T4 priced at 0.5 credits per GPU-hour."""
    h100 = fleet(name="lab-c1")
    t4 = ClusterFactory(name="lab-c2")
    node = NodeFactory(cluster=t4)
    for index in range(2):
        GpuDeviceFactory(node=node, cluster=t4, index=index, model="Tesla T4", memory_mib=15360)
    placement.usage_recompute(cluster_ids=[t4.pk])
    Price.objects.update_or_create(gpu_model="Tesla T4", defaults={"credits_per_gpu_hour": Decimal("0.5")})
    return h100, t4


def test_start_form_offers_each_gpu_model_with_what_is_free_and_its_price(console, staff_user):
    _, t4 = two_models()
    SessionFactory(cluster=t4)  # a row only: what counts as taken is the reservation below
    device = GpuDevice.objects.filter(model="Tesla T4").order_by("index").first()
    Allocation.objects.create(session=Session.objects.get(), device=device, memory_mib=15360, cores=100, exclusive=True)
    placement.usage_recompute(cluster_ids=[t4.pk])
    h100 = GpuDevice.objects.filter(cluster__name="lab-c1").values_list("model", flat=True).first()
    text = page_text(console.get(START))
    assert f"{h100}: 4 of 4 free" in text
    assert "Tesla T4: 1 of 2 free, 15 GiB per GPU, 0.50 credits per GPU-hour" in text
    assert 'name="gpu_models"' in text and "none ticked: any model" in text


def test_start_form_places_on_the_ticked_model(console, staff_user):
    two_models()
    grant(staff_user)
    response = console.post(START, start_form(gpu_models=["Tesla T4"]))
    session = Session.objects.get()
    assert response.status_code == 302
    assert (session.gpu_models, session.cluster.name) == (["Tesla T4"], "lab-c2")
    assert "1 whole of Tesla T4" in page_text(console.get(response["Location"]))


def test_start_form_without_a_model_accepts_any(console, staff_user):
    two_models()
    grant(staff_user)
    console.post(START, start_form())
    assert Session.objects.get().gpu_models == []


def test_start_form_unknown_model_is_the_apis_refusal(console, staff_user):
    two_models()
    grant(staff_user)
    text = _refused(console, start_form(gpu_models=["A100"]), "gpu_model_unknown", 400, "No GPU in the fleet matches 'A100'")
    assert "Tesla T4" in text


@pytest.mark.parametrize("models", [["T4\x00"], ["x" * 129]])
def test_start_form_malformed_model_is_a_form_error(console, staff_user, models):
    two_models()
    grant(staff_user)
    response = console.post(START, start_form(gpu_models=models))
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert Session.objects.count() == 0
