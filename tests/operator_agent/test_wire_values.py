"""Hostile times, quantities and bodies on the paths that read them: the operator's internal endpoints (with an
operator token), the ``?since=``/``?until=`` filters, and a PersistentVolume's capacity read from an apiserver. Each
answer is 400 JSON with a stable code (or the value is read correctly) and bounded: a hostile value is refused before
the costly part of reading it (the parsers see at most their ``MAX_LENGTH``; an oversized or too deeply nested body
never reaches the schema validator), which the spies below count, independently of the machine's speed."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import kubernetes.utils.quantity
import pytest
from jsonschema import Draft202012Validator

import contract
from clusters.operator_token.tokens import operator_token_mint
from contract import quantity, rfc3339
from tests.factories import ClusterFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def parsed_times(monkeypatch) -> list[str]:
    """The texts ``rfc3339.parse`` handed to ``datetime.fromisoformat``, from any thread (the live server's too)."""
    seen: list[str] = []
    real = rfc3339._fromisoformat

    def spy(text: str):
        seen.append(text)
        return real(text)

    monkeypatch.setattr(rfc3339, "_fromisoformat", spy)
    return seen


class _GrammarSpy:
    def __init__(self, real, seen: list[str]):
        self.real, self.seen = real, seen

    def fullmatch(self, text: str):
        self.seen.append(text)
        return self.real.fullmatch(text)


@pytest.fixture
def quantity_work(monkeypatch) -> dict[str, list[str]]:
    """The texts the quantity grammar was matched against (``grammar``) and those handed to the ``kubernetes``
    client's parser (``client``: ``decimal.Decimal``, unbounded in time and memory for ``1e99999999``)."""
    seen: dict[str, list[str]] = {"grammar": [], "client": []}
    monkeypatch.setattr(quantity, "_GRAMMAR", _GrammarSpy(quantity._GRAMMAR, seen["grammar"]))
    real = kubernetes.utils.quantity.parse_quantity

    def client_spy(text):
        seen["client"].append(text)
        return real(text)

    monkeypatch.setattr(kubernetes.utils.quantity, "parse_quantity", client_spy)
    return seen


@pytest.fixture
def validations(monkeypatch) -> list[int]:
    """One entry per call of the JSON-schema validators of the internal endpoints (``iter_errors``), any thread."""
    calls: list[int] = []
    real = Draft202012Validator.iter_errors

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Draft202012Validator, "iter_errors", spy)
    return calls

HOSTILE_TIMES = [
    "2026-11-29T23:59:60Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59-01:00", "2026-11-29T16:00:00+24:00",
    "2026-11-29t16:00:00z", "2026-11-29T16:00:00." + "1" * 100 + "Z", "２０２６-11-29T16:00:00Z",
    "2026-11-29T16:00:00\x00Z", "2026-11-29T16:00:00Z\x00", "2026-11-29T16:00:00\x1b[31mZ", " 2026-11-29T16:00:00Z",
    "2026-11-29T16:00:00+05:30:00", "0001-01-01T00:00:00+14:00", "x" * 1_000_000, "+-1", ".", "",
]


@pytest.mark.parametrize("raw", HOSTILE_TIMES, ids=lambda raw: repr(raw[:30]))
def test_a_hostile_time_is_refused_before_it_is_parsed_whole(raw, parsed_times):
    assert rfc3339.parse(raw) is None
    assert all(len(text) <= rfc3339.MAX_LENGTH for text in parsed_times), [len(t) for t in parsed_times]
    if len(raw) > rfc3339.MAX_LENGTH or not raw.isprintable():
        assert parsed_times == []  # refused on its length or characters alone
    assert rfc3339.parse("2026-11-29T16:00:00Z") is not None and len(parsed_times) >= 1  # the spy sees parses


@pytest.mark.parametrize(("raw", "expected"), [
    ("2026-11-29T16:00:00-00:00", datetime(2026, 11, 29, 16, tzinfo=UTC)),
    ("9999-12-31T23:59:59Z", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ("2026-11-29T16:00:00.1234567Z", datetime(2026, 11, 29, 16, 0, 0, 123456, tzinfo=UTC)),
    ("2026-11-29T16:00:00-23:59", datetime(2026, 11, 30, 15, 59, tzinfo=UTC)),
])
def test_edge_times_are_read_correctly(raw, expected):
    assert rfc3339.parse(raw) == expected


HOSTILE_QUANTITIES = ["1e99999", "1e-99999", "9" * 10_000, "+-1", ".", "0x10", "1Gi\x00", "１", "NaN", "sNaN", "-Infinity",
                      "1_000", "", "\u00a01Gi", "1\nGi", "x" * 1_000_000]


@pytest.mark.parametrize("raw", HOSTILE_QUANTITIES, ids=lambda raw: repr(raw[:20]))
def test_a_hostile_quantity_is_a_value_error_before_decimal_reads_it(raw, quantity_work):
    from kube import parse_quantity as gateway_parse_quantity

    for parse in (quantity.parse_quantity, gateway_parse_quantity):
        with pytest.raises(ValueError):
            parse(raw)
    # The grammar (a linear regex) saw at most MAX_LENGTH characters; Decimal never saw any of these.
    assert all(len(text) <= quantity.MAX_LENGTH for text in quantity_work["grammar"])
    assert quantity_work["client"] == []
    assert quantity.parse_quantity("1Gi") == 1 << 30 and quantity_work["client"] == ["1Gi"]  # the spies see parses


def test_a_moved_pv_with_a_nan_capacity_gets_the_request():
    """An apiserver's PersistentVolume reporting ``capacity.storage: NaN`` must not crash a volume move."""
    from storage.move import moved_persistent_volume

    old = {"spec": {"capacity": {"storage": "NaN"}, "nfs": {"server": "nas", "path": "/v"}}}
    pv = moved_persistent_volume(old_pv=old, name="pv", namespace="ns", claim_name="c", labels={}, request="10Gi")
    assert pv["spec"]["capacity"]["storage"] == "10Gi"


@pytest.fixture
def operator(live_server) -> Http:
    return Http(live_server.url, operator_token_mint(cluster_id=ClusterFactory(name="lab-c1").public_id))


def assert_refused(response, code: str, *, limit: int = 4000) -> None:
    assert response.status_code == 400, response.text[:500]
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["code"] == code
    assert len(response.text) < limit, len(response.text)


def test_a_hostile_observed_at_is_invalid_status(operator, parsed_times):
    for raw in ["2026-11-29T16:00:00\x00Z", "2026-11-29T16:00:00\x07Z", "2026-11-29T23:59:60Z", "x" * 100_000, 12, None, ["2026"]]:
        body = {"reports": [{"session": "ses_abc", "phase": "Running", "observed_at": raw}]}
        assert_refused(operator.post(contract.STATUS_PATH, json=body), "invalid_status")
    assert parsed_times == ["2026-11-29T23:59:60Z"]  # the only one the schema and the character check let through


def test_a_hostile_read_at_is_invalid_storage_report(operator):
    for raw in ["2026-11-29T16:00:00\x00Z", "2026-11-29T16:00:00\x1bZ", "0000-01-01T00:00:00Z", "1" * 70, 5]:
        body = {"read_at": raw, "storage_classes": [], "volumes": [], "nodes": []}
        assert_refused(operator.post(contract.STORAGE_PATH, json=body), "invalid_storage_report")


def test_hostile_byte_counts_are_invalid_storage_report(operator):
    for value in [2**63, -1, 1.5, "1Gi", 10**400]:
        body = {"read_at": "2026-11-29T16:00:00Z", "storage_classes": [{"storage_class": "s", "capacity_bytes": value, "objects": 0}],
                "volumes": [], "nodes": [{"name": "n", "disk_bytes": value}]}
        assert_refused(operator.post(contract.STORAGE_PATH, data=json.dumps(body), headers={"Content-Type": "application/json"}),
                       "invalid_storage_report")


def test_a_huge_label_key_in_an_inventory_problem_is_not_echoed_whole(operator):
    key = "k" * 200_000
    body = {"nodes": [{"name": "n", "ready": True, "devices": [], "labels": {key: 5}}]}
    response = operator.put(contract.INVENTORY_PATH, json=body)
    assert_refused(response, response.json().get("code", "?"), limit=4000)


def test_a_huge_key_with_a_nul_in_a_storage_report_is_not_echoed_whole(operator):
    key = "\x00" + "k" * 200_000
    body = {"read_at": "2026-11-29T16:00:00Z", "storage_classes": [], "volumes": [], "nodes": [], "extra": {key: "v"}}
    assert_refused(operator.post(contract.STORAGE_PATH, json=body), "invalid_storage_report")


def test_deeply_nested_bodies_are_refused_as_json(operator, validations):
    for depth in [5000, 200_000]:
        text = '{"reports": ' + "[" * depth + "]" * depth + "}"
        response = operator.post(contract.STATUS_PATH, data=text, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and response.json()["code"], response.text[:300]
        assert "nested too deeply" in response.json()["detail"], response.text[:300]
    assert validations == []  # refused by the JSON parser, never walked by the validator
    text = '{"reports": ' + "[" * 50 + "]" * 50 + "}"  # within the parser's depth: the schema refuses it
    assert_refused(operator.post(contract.STATUS_PATH, data=text, headers={"Content-Type": "application/json"}),
                   "invalid_status")
    assert validations


def test_duplicate_keys_in_a_status_report_are_read_one_way(operator):
    text = '{"reports": [], "reports": [{"session": "ses_x", "phase": "Bogus", "observed_at": "2026-11-29T16:00:00Z"}]}'
    response = operator.post(contract.STATUS_PATH, data=text, headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 400) and response.json(), response.text[:300]
    if response.status_code == 400:
        assert response.json()["code"] == "invalid_status"


@pytest.mark.parametrize("path", ["/api/v1/audit", "/api/v1/billing/ledger"])
def test_hostile_since_and_until_are_invalid_request(http, path, parsed_times):
    for raw in ["2026-11-29T16:00:00%00Z", "2026-11-29T16:00:00%1BZ", "%1B%5B31m", "x" * 10_000, "2026-11-29T23:59:60Z", "１"]:
        for name in ("since", "until"):
            response = http.get(f"{path}?{name}={raw}")
            assert_refused(response, "invalid_request")
    # the 10 KB value was refused on its length; only short printable texts were parsed
    assert sorted(set(parsed_times)) == ["2026-11-29T23:59:60Z", "１"], parsed_times


def test_a_long_malformed_list_is_refused_before_validation(operator, validations):
    """60,000 malformed reports (2.5 MB, far below the 32 MB body limit): validating every one took seconds of CPU, so
    a list over its ``maxItems`` is refused before the validator runs at all."""
    for path, body, code in [
        (contract.STATUS_PATH, {"reports": [{"session": 5, "phase": 1, "observed_at": 2}] * 60_000}, "invalid_status"),
        (contract.INVENTORY_PATH, {"nodes": [{"name": 5, "ready": "x", "devices": 1}] * 60_000}, "invalid_inventory"),
        (contract.STORAGE_PATH, {"read_at": "2026-11-29T16:00:00Z", "storage_classes": [], "nodes": [],
                                 "volumes": [{"volume_id": 1}] * 60_000}, "invalid_storage_report"),
        (contract.INVENTORY_PATH, {"nodes": [{"name": "n", "ready": True, "devices": [{"uuid": 1}] * 2000}] * 30}, "invalid_inventory"),
    ]:
        text = json.dumps(body)
        response = operator.request("PUT" if path == contract.INVENTORY_PATH else "POST", path, data=text,
                                    headers={"Content-Type": "application/json"})
        assert_refused(response, code)
        assert "has more than" in response.json()["detail"]
    assert validations == []
    small = {"reports": [{"session": 5, "phase": 1, "observed_at": 2}] * 3}  # within maxItems: validated, refused
    assert_refused(operator.post(contract.STATUS_PATH, json=small), "invalid_status")
    assert validations


@pytest.mark.parametrize("raw", ["1e100", "-1Gi", "9223372036854775808", "8Ei", "-1"])
def test_a_hostile_quantity_in_the_cluster_is_left_out_of_the_operators_storage_report(raw):
    """A CSIStorageCapacity or node capacity the contract cannot carry (negative, beyond int64) must not make the whole
    report refused (one bad object would stop every volume status of the cluster): it is left out like an unreadable one."""
    from jsonschema import Draft202012Validator

    from operator_agent.reporters.storage import storage_report

    report = storage_report(
        read_at=datetime(2026, 11, 29, 16, tzinfo=UTC), pvcs=[], events=[], pods=[],
        capacities=[{"storageClassName": "nfs-a", "capacity": raw, "metadata": {"name": "c", "namespace": "n"}}],
        nodes=[{"metadata": {"name": "n1"}, "status": {"capacity": {"ephemeral-storage": raw}}}],
    )
    assert list(Draft202012Validator(contract.STORAGE_REPORT_SCHEMA).iter_errors(report)) == [], report
    assert report["storage_classes"] == [{"storage_class": "nfs-a", "capacity_bytes": None, "objects": 1}]
    assert report["nodes"] == []


def test_a_status_report_from_a_clock_far_ahead_does_not_freeze_the_session(live_server, http_user, plain_user):
    """An operator whose clock ran years ahead once (year 9999 is a valid time) must not make every later, honest
    report of the session look older and be ignored: the session could then never be reported Terminated. The report is
    refused (409 ``report_from_future``), so nothing of it is kept."""
    from sessions.models import Session
    from tests.factories import SessionFactory

    session = SessionFactory(owner=plain_user, phase=Session.Phase.STARTING)
    operator = Http(live_server.url, operator_token_mint(cluster_id=session.cluster.public_id))

    def report(phase: str, observed_at: str):
        body = {"reports": [{"session": session.public_id, "phase": phase, "observed_at": observed_at}]}
        return operator.post(contract.STATUS_PATH, json=body)

    refused = report("Running", "9999-12-31T23:59:59Z")
    assert refused.status_code == 409 and refused.json()["code"] == contract.REPORT_FROM_FUTURE
    assert http_user.get(f"/api/v1/sessions/{session.public_id}").status_code == 200
    session.refresh_from_db()
    assert session.last_status_at is None and session.started_at is None
    honest = report("Terminated", refused.json()["server_time"])
    assert honest.status_code == 200, honest.text[:300]
    session.refresh_from_db()
    assert session.phase == Session.Phase.TERMINATED
