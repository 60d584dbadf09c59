"""The console's cluster scope through Django's test client on the real console URLs: ``?cluster=`` by id or name
stores the choice and redirects without it, the top bar lists registered clusters only, every list narrows to the
chosen cluster and says so, detail pages of other clusters still open, and narrowed lists keep constant queries."""

from __future__ import annotations

import datetime
import itertools
from decimal import Decimal

import pytest
from django.utils import timezone

from audit.models import AuditRecord
from billing.models import CreditAccount, LedgerEntry, UsageSample
from clusters.models import Cluster
from console.scope import SESSION_KEY
from tests.console_checks import page_text
from tests.factories import (
    ClusterFactory,
    NodeDiskFactory,
    SessionFactory,
    StorageCapacityReadingFactory,
    StoragePoolFactory,
    UserFactory,
    VolumeFactory,
)

pytestmark = pytest.mark.django_db
_seq = itertools.count()


@pytest.fixture
def two():
    return ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2", status=Cluster.Status.DEGRADED)


def _ledger(session=None, account=None):
    account = account or CreditAccount.objects.create(user=UserFactory())
    return LedgerEntry.objects.create(account=account, kind="charge" if session else "grant",
                                      amount=Decimal("-1") if session else Decimal("10"), balance_after=Decimal(0),
                                      idempotency_key=f"k-{next(_seq)}", session=session)


def _sample(session):
    start = timezone.now() - datetime.timedelta(minutes=10 + next(_seq))
    return UsageSample.objects.create(cluster=session.cluster, session=session, sample_id=f"s-{next(_seq)}", device_uuid="GPU-1",
                                      start=start, end=start + datetime.timedelta(seconds=30), share=Decimal(1),
                                      cost=Decimal("0.01"))


def _audit(cluster):
    return AuditRecord.objects.create(actor="api:alice", action="cluster_update", object_type="cluster",
                                      object_id=cluster.public_id, object_repr=cluster.name, cluster=cluster.public_id,
                                      cluster_name=cluster.name)


def _rows(cluster, n=1):
    """One row of every narrowed list on ``cluster`` (``n`` of each); returns {list url: [rows]}."""
    rows = {}
    for _ in range(n):
        session = SessionFactory(cluster=cluster)
        pool = StoragePoolFactory(cluster=cluster, sharing="selected")
        for url, row in [
            ("/storage/volume/", VolumeFactory(cluster=cluster, pool=pool)),
            ("/storage/storagepool/", pool),
            ("/storage/storagecapacityreading/", StorageCapacityReadingFactory(cluster=cluster, storage_class=f"sc-{next(_seq)}")),
            ("/storage/nodedisk/", NodeDiskFactory(cluster=cluster)),
            ("/billing/usagesample/", _sample(session)),
            ("/billing/ledgerentry/", _ledger(session)),
            ("/audit/auditrecord/", _audit(cluster)),
        ]:
            rows.setdefault(url, []).append(row)
    return rows


NARROWED = ["/storage/volume/", "/storage/storagepool/", "/storage/storagecapacityreading/", "/storage/nodedisk/",
            "/billing/usagesample/", "/billing/ledgerentry/", "/audit/auditrecord/"]


def test_cluster_by_id_stores_and_redirects_without_the_parameter(console, two):
    a, _b = two
    response = console.get(f"/storage/volume/?cluster={a.public_id}&status__exact=bound&o=1")
    assert response.status_code == 302
    assert response["Location"] == "/storage/volume/?status__exact=bound&o=1"
    assert console.session[SESSION_KEY] == a.public_id


def test_cluster_by_name_stores_it(console, two):
    _a, b = two
    response = console.get("/storage/volume/?cluster=lab-c2")
    assert response.status_code == 302 and response["Location"] == "/storage/volume/"
    assert console.session[SESSION_KEY] == b.public_id
    assert console.get("/").context["console_cluster"].public_id == b.public_id


def test_all_clears_the_choice(console, two):
    console.get(f"/?cluster={two[0].public_id}")
    assert console.get("/?cluster=all")["Location"] == "/"
    assert SESSION_KEY not in console.session


def test_unknown_name_warns_and_shows_all(console, two):
    console.get(f"/?cluster={two[0].public_id}")
    response = console.get("/storage/volume/?cluster=nope", follow=True)
    assert response.redirect_chain == [("/storage/volume/", 302)]
    text = page_text(response)
    assert "No registered cluster is named or has the id 'nope': showing all clusters." in text
    assert "Narrowed to cluster" not in text
    assert SESSION_KEY not in console.session


def test_top_bar_lists_registered_clusters_with_status(console, two):
    ClusterFactory(name="old-c0", status=Cluster.Status.DEREGISTERED)
    console.get("/?cluster=lab-c2")
    page = page_text(console.get("/storage/volume/"))
    assert '<label for="console-cluster">Cluster</label>' in page
    text = page[page.index('<select id="console-cluster"'):page.index("</select>")]
    assert ">All clusters</option>" in text
    assert ">lab-c1: connected</option>" in text
    assert f'<option value="{two[1].public_id}" selected>lab-c2: degraded</option>' in text
    assert "old-c0" not in text


def test_deregistered_cluster_cannot_be_chosen_by_name(console, two):
    ClusterFactory(name="old-c0", status=Cluster.Status.DEREGISTERED)
    response = console.get("/?cluster=old-c0", follow=True)
    assert "showing all clusters" in page_text(response)
    assert SESSION_KEY not in console.session


@pytest.mark.parametrize("url", NARROWED)
def test_each_list_narrows_and_says_so(console, two, url):
    a, b = two
    mine, theirs = _rows(a)[url], _rows(b)[url]
    if url == "/billing/ledgerentry/":
        theirs.append(_ledger())  # a grant: no session, hidden while narrowed
    everything = console.get(url).context["cl"].result_list
    assert {r.pk for r in mine + theirs} <= {r.pk for r in everything}
    console.get(f"{url}?cluster=lab-c1")
    response = console.get(url)
    assert {r.pk for r in response.context["cl"].result_list} == {r.pk for r in mine}
    text = page_text(response)
    assert "Narrowed to cluster <strong>lab-c1</strong> · " in text
    assert f'<a href="{url}?cluster=all">Show all clusters</a>' in text
    # The detail page of another cluster's row still opens.
    assert console.get(f"{url}{theirs[0].pk}/change/").status_code == 200
    # One click back to all.
    back = console.get(f"{url}?cluster=all", follow=True)
    assert back.redirect_chain == [(url, 302)]
    assert "Narrowed to cluster" not in page_text(back)


def test_show_all_keeps_the_lists_filters(console, two):
    console.get("/?cluster=lab-c1")
    html = console.get("/storage/volume/?status__exact=bound").content.decode()
    assert '<a href="/storage/volume/?status__exact=bound&amp;cluster=all">Show all clusters</a>' in html


def test_pools_shared_with_the_cluster_are_listed(console, two):
    a, b = two
    shared = StoragePoolFactory(cluster=b, sharing="all")
    selected = StoragePoolFactory(cluster=b, sharing="selected")
    selected.allowed_clusters.add(a)
    private = StoragePoolFactory(cluster=b, sharing="selected")
    console.get("/?cluster=lab-c1")
    listed = {p.pk for p in console.get("/storage/storagepool/").context["cl"].result_list}
    assert {shared.pk, selected.pk} <= listed and private.pk not in listed


@pytest.mark.parametrize("url", NARROWED)
def test_narrowed_lists_keep_constant_queries(console, two, url, django_assert_max_num_queries):
    a, b = two
    _rows(a, 2)
    _rows(b, 1)
    console.get(f"{url}?cluster=lab-c1")
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        assert console.get(url).status_code == 200
    _rows(a, 8)
    with django_assert_max_num_queries(len(few)):
        response = console.get(url)
    assert response.status_code == 200 and len(response.context["cl"].result_list) >= 10


def test_times_carry_their_zone(console, two):
    _audit(two[0])
    text = page_text(console.get("/audit/auditrecord/"))
    assert timezone.now().strftime("%Y-%m-%d") in text and " UTC" in text


@pytest.mark.parametrize("path", ["/%2Fevil.example/", "/%2F%2Fevil.example/", "/%5Cevil.example/"])
def test_the_redirect_never_leaves_the_site(console, two, path):
    location = console.get(path, {"cluster": "lab-c1", "o": "1"})["Location"]
    assert location.startswith("/") and not location.startswith(("//", "/\\")), location
    assert location.endswith("evil.example/?o=1")


def test_a_ref_naming_no_cluster_warns_and_shows_all(console, two):
    console.get("/?cluster=lab-c1")
    response = console.get("/", {"cluster": "x" * 10_000}, follow=True)
    assert response.redirect_chain == [("/", 302)]
    assert "x" * 79 + "…': showing all clusters." in page_text(response)  # the ref shortened in the message
    assert SESSION_KEY not in console.session


@pytest.mark.parametrize("ref", ["\x00", "lab-c1\x00", "all\x00"])
def test_a_nul_in_the_ref_is_refused_before_the_scope(console, two, ref):
    console.get("/?cluster=lab-c1")
    response = console.get("/", {"cluster": ref})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"  # core.middleware's NUL rule
    assert console.session[SESSION_KEY] == two[0].public_id
