"""``POST /api/v1/sessions`` with an ``Idempotency-Key``, through HTTP on the live server: a retry gets the first
session back, concurrent senders of one key create one session, another body with the key is 409."""

import threading

import pytest
from django.db import IntegrityError, connections

from sessions.models import Session
from tests.factories import SessionFactory, UserFactory
from tests.helpers import Http, run_threads

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")
BODY = {"image": "quay.io/jupyter/base-notebook", "gpus": 1, "name": "nb"}


@pytest.fixture(autouse=True)
def patient_probe(settings):
    """The emulated apiservers get more than the test settings' 3 s on a loaded machine."""
    settings.GSHARE_PROBE_TIMEOUT = 10.0


def start(http, key: str | None, **body):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return http.post("/api/v1/sessions", json={**BODY, **body}, headers=headers)


def test_a_retry_returns_the_first_session(http, live_cluster):
    _, emulated = live_cluster("lab-c1")
    first = start(http, "key-1")
    assert first.status_code == 201, first.text
    again = start(http, "key-1")
    assert again.status_code == 200, again.text
    assert again.json() == first.json() | {"phase": again.json()["phase"]}
    assert again.json()["id"] == first.json()["id"]
    assert Session.objects.count() == 1 and len(emulated.objects_of(*GSS)) == 1
    # The request as the API reads it: an omitted field and its default are the same request.
    assert start(http, "key-2", volumes=[]).status_code == 201
    assert start(http, "key-2").status_code == 200
    assert Session.objects.count() == 2


def test_another_body_with_the_key_is_refused(http, live_cluster):
    live_cluster("lab-c1")
    first = start(http, "key-1").json()
    for change in ({"gpus": 2}, {"name": "other"}, {"gpu_memory_mib": 1024}, {"cluster": "lab-c1"}):
        response = start(http, "key-1", **change)
        assert response.status_code == 409, response.text
        body = response.json()
        assert body["code"] == "idempotency_key_reused" and body["session"] == first["id"]
        assert "new key" in body["detail"]
    assert Session.objects.count() == 1


def test_keys_belong_to_their_owner(http, http_user, live_cluster):
    live_cluster("lab-c1")
    staffs = start(http, "shared-key")
    mine = start(http_user, "shared-key")
    assert staffs.status_code == 201 and mine.status_code == 201
    assert staffs.json()["id"] != mine.json()["id"]
    assert start(http_user, "shared-key").json()["id"] == mine.json()["id"]


def test_without_a_key_every_post_is_a_new_session(http, live_cluster):
    live_cluster("lab-c1")
    assert start(http, None).json()["id"] != start(http, None).json()["id"]
    assert Session.objects.count() == 2


@pytest.mark.parametrize("key", ["", "k" * 151, "tab\there", "bell\x07"])
def test_malformed_keys(http, live_cluster, key):
    live_cluster("lab-c1")
    response = start(http, key)
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert "Idempotency-Key" in response.json()["detail"]
    assert not Session.objects.exists()


def test_a_refused_request_stores_nothing_and_its_retry_is_tried_again(http, live_cluster):
    live_cluster("lab-c1")
    assert start(http, "key-1", gpus=16).json()["code"] == "no_capacity"
    assert start(http, "key-1", gpus=16).json()["code"] == "no_capacity"  # not a replay: nothing was stored
    assert start(http, "key-1", gpus=2).status_code == 201  # a refused request did not take the key


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_with_one_key_create_one_session(live_server, staff_token, live_cluster):
    """Eight senders at once, one key, a request that takes all 8 GPUs of the only node that fits: one session, the
    others get it back (not 409 no_capacity: the key is checked under the owner's lock, before placement)."""
    _, emulated = live_cluster("lab-c1")
    results, errors = [], []
    barrier = threading.Barrier(8)

    def send() -> None:
        try:
            barrier.wait()
            results.append(start(Http(live_server.url, staff_token), "one-key", gpus=8))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(send, [()] * 8, timeout=120)
    assert not errors
    assert sorted(r.status_code for r in results) == [200] * 7 + [201], [r.text for r in results]
    assert len({r.json()["id"] for r in results}) == 1
    assert Session.objects.count() == 1 and len(emulated.objects_of(*GSS)) == 1


def test_the_database_holds_one_session_per_owner_and_key():
    owner = UserFactory()
    SessionFactory(owner=owner, idempotency_key="k")
    SessionFactory(owner=owner)  # no key: any number
    SessionFactory(owner=owner)
    SessionFactory(idempotency_key="k")  # another owner
    with pytest.raises(IntegrityError):
        SessionFactory(owner=owner, idempotency_key="k")


def test_gpu_models_are_part_of_the_request(http, live_cluster):
    """Omitted and ``[]`` are one request (the fingerprint of a request without models is what it was before
    ``gpu_models``); other models with the same key are another request; the same names in another order are not."""
    live_cluster("lab-c1")
    first = start(http, "key-1", gpu_models=["H100", "V100"])
    assert first.status_code == 201, first.text
    assert start(http, "key-1", gpu_models=["V100", "H100"]).json()["id"] == first.json()["id"]
    for change in ({"gpu_models": ["H100"]}, {"gpu_models": []}, {}):
        response = start(http, "key-1", **change)
        assert response.status_code == 409 and response.json()["code"] == "idempotency_key_reused", response.text
    assert start(http, "key-2").status_code == 201
    assert start(http, "key-2", gpu_models=[]).status_code == 200
    assert Session.objects.count() == 2
