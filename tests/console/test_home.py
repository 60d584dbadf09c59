"""A researcher's home page (the console's index for a user who is not staff, ``console.home``) through Django's test
client: their running and queued sessions with the session list's figures (cost so far, credits per hour), Open and
Stop, their credits and runway (the My credits figures), what is free now by GPU model over the clusters their policy
allows (the Start session form's figure) with its price, the Start session button, an empty state that reads well,
never another user's session, and a number of queries that does not grow with their sessions. The browser test is
``test_home_browser.py``."""

from __future__ import annotations

import html
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import services as billing
from billing.models import CreditAccount, LedgerEntry, Policy
from billing.selectors import account_summary, session_hourly_cost
from console.dashboard import utc
from console.figures import credits_display
from sessions import placement
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
H100 = "NVIDIA H100 80GB HBM3"
A10 = "NVIDIA A10"
LIST = "/gpu_sessions/session/"


@pytest.fixture(autouse=True)
def frozen():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def _cluster(name: str, model: str, gpus: int):
    cluster = ClusterFactory(name=name, session_domain=f"{name}.gshare.localhost")
    node = NodeFactory(cluster=cluster, name=f"{name}-node")
    devices = [GpuDeviceFactory(node=node, cluster=cluster, index=i, model=model, memory_mib=24_000 if model == A10 else 81_559)
               for i in range(gpus)]
    return cluster, devices


def _reserve(session: Session, device, *, whole: bool = True) -> None:
    Allocation.objects.create(session=session, device=device, memory_mib=device.memory_mib if whole else 4096,
                              cores=100 if whole else 25, exclusive=whole)
    placement.usage_recompute(cluster_ids=[device.cluster_id])  # the GPU's counters, as placement keeps them


def _charge(session: Session, amount: str) -> None:
    account, _ = CreditAccount.objects.get_or_create(user=session.owner)
    billing.ledger_append(account=account, kind=LedgerEntry.Kind.CHARGE, amount=Decimal(amount), idempotency_key=f"e-{uuid.uuid4()}",
                          session=session, created_by="test")


def _queued(owner, *, name: str, position: int, **fields) -> Session:
    """A session waiting in the queue, as the queue leaves it (no cluster, a position and an estimate)."""
    defaults = {"gpus": 8, "gpu_models": [H100], "queue_position": position, "estimated_start": NOW + 5 * HOUR,
                "queued_at": NOW - HOUR, "waiting_for": "8 × H100 on one node; the earliest frees at 17:00"}
    return Session.objects.create(owner=owner, name=name, image="quay.io/jupyter/base-notebook", phase=Session.Phase.QUEUED,
                                  **{**defaults, **fields})


@pytest.fixture
def world(django_user_model):
    """alice (a researcher, 100 credits) with a Running session on lab-h1 (one whole H100, 3 credits per GPU-hour, a
    time limit at 15:00, 1.5 credits charged) and a queued one; bob with a Running session on lab-h1 and a queued one;
    lab-h2's two A10s at the default price (2)."""
    alice = django_user_model.objects.create_user("alice", "alice@example.test", "pw")
    bob = UserFactory(username="bob")
    billing.price_set(gpu_model="", credits_per_gpu_hour=Decimal("2"))
    billing.price_set(gpu_model=H100, credits_per_gpu_hour=Decimal("3"))
    lab_h1, h100s = _cluster("lab-h1", H100, 4)
    lab_h2, _a10s = _cluster("lab-h2", A10, 2)
    billing.credit_grant(user=alice, amount=Decimal("100"), reason="welcome", idempotency_key="home:alice", created_by="test")
    train = SessionFactory(owner=alice, cluster=lab_h1, node="lab-h1-node", name="train", started_at=NOW - 2 * HOUR)
    Session.objects.filter(pk=train.pk).update(ends_at=NOW + 3 * HOUR)
    _reserve(train, h100s[0])
    _charge(train, "-1.5")
    big = _queued(alice, name="big-run", position=2)
    secret = SessionFactory(owner=bob, cluster=lab_h1, node="lab-h1-node", name="bob-secret-run")
    _reserve(secret, h100s[1])
    bobs_queued = _queued(bob, name="bob-queued-run", position=1)
    return {"alice": alice, "bob": bob, "train": Session.objects.get(pk=train.pk), "big": big, "secret": secret,
            "bobs_queued": bobs_queued, "lab_h1": lab_h1, "lab_h2": lab_h2}


@pytest.fixture
def as_alice(client, world):
    client.force_login(world["alice"])
    return client


def _text(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def _row(text: str, public_id: str) -> str:
    """The ``<tr>`` of ``public_id`` on the home page."""
    start = text.index(f'<tr data-session="{public_id}"')
    return text[start:text.index("</tr>", start)]


def test_a_researcher_sees_their_running_and_queued_sessions(as_alice, world):
    text = _text(as_alice.get("/"))
    assert 'id="home"' in text and "Recent actions" not in text
    train = _row(text, world["train"].public_id)
    assert 'data-phase="Running"' in train and ">train<" in train
    assert "1 whole GPU<" in train and H100 in train
    assert 'data-cell="where">lab-h1 / lab-h1-node<' in train
    assert 'data-cell="cost" title="1.500000 credits">1.50<' in train
    rate = session_hourly_cost(world["train"])
    assert rate == Decimal("3.000000")  # one whole H100 at 3 credits per GPU-hour: the session page's figure
    assert f'title="{rate} credits per hour">{credits_display(rate)}<' in train
    assert f"ends {utc(NOW + 3 * HOUR)}" in train
    assert f'action="{LIST}{world["train"].pk}/open/"' in train and f'action="{LIST}{world["train"].pk}/stop/"' in train
    assert train.count("csrfmiddlewaretoken") == 2 and 'name="next" value="/"' in train

    big = _row(text, world["big"].public_id)
    assert 'data-phase="Queued"' in big and "8 whole GPUs" in big and f"{H100} (asked)" in big
    assert 'data-cell="where">-<' in big
    assert f"#2 in the queue · starts about {utc(NOW + 5 * HOUR)}" in html.unescape(big)
    assert "the earliest frees at 17:00" in big
    assert "/open/" not in big and f'action="{LIST}{world["big"].pk}/stop/"' in big  # a queued session can be stopped (left)
    # The running session comes first, then the queue.
    assert text.index(world["train"].public_id) < text.index(world["big"].public_id)
    assert 'id="home-start" href="/gpu_sessions/session/start/"' in text


def test_other_users_sessions_never_show(as_alice, world):
    text = _text(as_alice.get("/"))
    for session in (world["secret"], world["bobs_queued"]):
        assert session.public_id not in text and session.name not in text
    assert f"/{world['secret'].pk}/" not in text


def test_credits_and_the_runway_are_the_my_credits_figures(as_alice, world):
    text = html.unescape(_text(as_alice.get("/")))
    summary = account_summary(world["alice"], now=NOW)
    assert summary["burn_rate_per_hour"] == Decimal("3.000000")  # the Running session only: the queued one burns nothing
    assert f'data-stat="available" title="{summary["available"]}">{credits_display(summary["available"])}<' in text
    assert f'data-stat="burn" title="{summary["burn_rate_per_hour"]}">3.00<' in text
    # 100 − 1.5 charged (balance 98.5) at 3 per hour: 32 h 50 min from NOW.
    assert summary["credits_last_until"] == NOW + timedelta(hours=32, minutes=50)
    assert f'id="home-runway">until {utc(summary["credits_last_until"])} (about 32 h)<' in text
    assert 'href="/billing/creditaccount/"' in text


def test_the_runway_is_a_dash_when_nothing_burns(as_alice, world):
    Session.objects.filter(pk=world["train"].pk).update(phase=Session.Phase.STOPPING)
    text = _text(as_alice.get("/"))
    assert 'id="home-runway">—<' in text


def test_free_now_by_model_with_the_price(as_alice, world):
    text = _text(as_alice.get("/"))
    h100 = text[text.index(f'<tr data-model="{H100}"'):]
    h100 = h100[:h100.index("</tr>")]
    assert 'data-cell="free">2 of 4<' in h100  # alice's and bob's reservations hold two of the four
    assert 'data-cell="price" title="3.000000">3.00<' in h100
    a10 = text[text.index(f'<tr data-model="{A10}"'):]
    assert 'data-cell="free">2 of 2<' in a10[:a10.index("</tr>")] and 'title="2.000000">2.00<' in a10[:a10.index("</tr>")]


def test_free_now_counts_only_the_clusters_the_policy_allows(as_alice, world):
    policy = Policy.objects.create(user=world["alice"])
    policy.allowed_clusters.set([world["lab_h2"]])
    text = _text(as_alice.get("/"))
    assert f'<tr data-model="{A10}"' in text and f'<tr data-model="{H100}"' not in text


def test_a_new_researcher_sees_a_sentence_and_the_start_button(client, world, django_user_model):
    carol = django_user_model.objects.create_user("carol", "carol@example.test", "pw")
    client.force_login(carol)
    text = _text(client.get("/"))
    assert 'id="home-no-sessions">You have no session running or waiting.' in text
    assert text.count('href="/gpu_sessions/session/start/"') == 2  # the top button and the empty state's
    assert 'id="home-runway">—<' in text and 'data-stat="available" title="0.000000">0.00<' in text
    assert "<table" in text  # the free GPUs are still listed
    assert not CreditAccount.objects.filter(user=carol).exists()  # reading the page creates nothing


def test_no_gpu_reported_reads_well(client, django_user_model):
    carol = django_user_model.objects.create_user("carol", "carol@example.test", "pw")
    client.force_login(carol)
    text = _text(client.get("/"))
    assert 'id="home-no-gpus">No GPU is reported on the clusters you may use yet.' in text


def test_stop_from_the_home_page_confirms_then_comes_back_home(as_alice, world):
    train = world["train"]
    confirm = as_alice.post(f"{LIST}{train.pk}/stop/", {"next": "/"})
    assert confirm.status_code == 200 and 'name="next" value="/"' in confirm.content.decode()
    done = as_alice.post(f"{LIST}{train.pk}/stop/", {"next": "/", "post": "yes"})
    assert done.status_code == 302 and done["Location"] == "/"
    assert Session.objects.get(pk=train.pk).phase == Session.Phase.STOPPING
    # Another user's session answers 404 and stays as it is.
    assert as_alice.post(f"{LIST}{world['secret'].pk}/stop/", {"next": "/", "post": "yes"}).status_code == 404
    assert Session.objects.get(pk=world["secret"].pk).phase == Session.Phase.RUNNING


def test_more_sessions_than_shown_link_to_my_sessions(as_alice, world, monkeypatch):
    monkeypatch.setattr("console.home.HOME_SESSIONS_SHOWN", 1)
    text = _text(as_alice.get("/"))
    assert world["train"].public_id in text and world["big"].public_id not in text
    assert 'id="home-more-sessions">1 more live session: see <a href="/gpu_sessions/session/">My sessions</a>.' in text


def test_queries_do_not_grow_with_the_researchers_sessions(as_alice, world, django_assert_max_num_queries):
    counts = []
    for batch in range(2):
        for i in range(6):
            session = SessionFactory(owner=world["alice"], cluster=world["lab_h2"], node="lab-h2-node", name=f"more-{batch}-{i}",
                                     gpus=1, gpu_memory_mib=4096, gpu_cores=25)
            device = world["lab_h2"].devices.order_by("pk")[i % 2]
            _reserve(session, device, whole=False)
            _charge(session, "-0.25")
            _queued(world["alice"], name=f"wait-{batch}-{i}", position=10 + i)
        with CaptureQueriesContext(connection) as queries:
            text = _text(as_alice.get("/"))
        counts.append(len(queries))
        assert "more-0-0" in text and "wait-0-0" in text
    assert counts[0] == counts[1], counts
    # 14 today: the login session and user, the home page's nine reads (prices, policy, the sessions' count, rows and
    # reservations, the account, the burn's sessions and reservations, the free GPUs), the user's permissions (two) and
    # the top bar's clusters.
    with django_assert_max_num_queries(14):
        as_alice.get("/")


def test_staff_keep_the_dashboard(client, world, django_user_model):
    staff = django_user_model.objects.create_superuser("admin", "admin@example.test", "pw")
    client.force_login(staff)
    text = _text(client.get("/"))
    assert 'id="dashboard"' in text and 'id="home"' not in text and "Recent actions" in text


def test_the_selectors_read_in_a_fixed_number_of_queries(world, django_assert_num_queries):
    from billing import pricing
    from billing.selectors import free_gpus_by_model
    from sessions.selectors import live_sessions_of

    prices = pricing.prices_by_model()
    with django_assert_num_queries(3):  # the count, the sessions, their reservations with their GPUs
        rows, total = live_sessions_of(user=world["alice"], limit=10, prices=prices)
    assert [r.session.public_id for r in rows] == [world["train"].public_id, world["big"].public_id] and total == 2
    assert rows[0].gpu_models == (H100,) and rows[0].holds_gpus and rows[0].cost_so_far == Decimal("1.500000")
    assert rows[1].gpu_models == (H100,) and not rows[1].holds_gpus and rows[1].cost_so_far == 0
    with django_assert_num_queries(2):  # the policy, the GPUs
        free = free_gpus_by_model(world["alice"], prices)
    assert free == [{"model": A10, "free": 2, "total": 2, "credits_per_gpu_hour": Decimal("2.000000")},
                    {"model": H100, "free": 2, "total": 4, "credits_per_gpu_hour": Decimal("3.000000")}]
