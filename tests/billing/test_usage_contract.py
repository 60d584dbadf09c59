"""One table of usage samples through both readers of the contract: ``billing.usage.parse_samples`` (the control
plane's fast hand-written path) and ``contract.USAGE_SCHEMA`` (what the operator's tests validate
against). Both must agree on every sample, except where the parser checks more than a schema can say."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import contract as shared
from billing.usage import InvalidUsageSample, parse_samples
from tests import contract

NOW = datetime(2026, 11, 29, 16, 0, 5, tzinfo=UTC)
GOOD = {"sample_id": "ses_a:GPU-a:1764432000000", "session_id": "ses_a", "device_uuid": "GPU-a",
        "start": "2026-11-29T15:59:00Z", "end": "2026-11-29T16:00:00Z", "gpu_util_percent": None, "memory_used_mib": None}
DROP = object()

#: (id, changes to GOOD, valid, beyond_schema): ``beyond_schema`` marks a sample the schema cannot refuse (the parser does).
CASES = [
    ("good", {}, True, False),
    ("optional-fields-absent", {"gpu_util_percent": DROP, "memory_used_mib": DROP}, True, False),
    ("figures", {"gpu_util_percent": 37.5, "memory_used_mib": 40960}, True, False),
    ("util-bounds", {"gpu_util_percent": 100, "memory_used_mib": 0}, True, False),
    ("fractional-seconds", {"start": "2026-11-29T15:59:00.123456Z", "end": "2026-11-29T16:00:00.123Z"}, True, False),
    ("offset-in-minutes", {"start": "2026-11-29T21:29:00+05:30", "end": "2026-11-29T11:00:00-05:00"}, True, False),
    ("longest-ids", {"sample_id": "s" * 128, "session_id": "s" * 128, "device_uuid": "d" * 128}, True, False),
    ("non-ascii-id", {"device_uuid": "GPU-ä"}, True, False),
    ("missing-sample-id", {"sample_id": DROP}, False, False),
    ("missing-end", {"end": DROP}, False, False),
    ("empty-id", {"session_id": ""}, False, False),
    ("id-too-long", {"sample_id": "s" * 129}, False, False),
    ("id-not-string", {"device_uuid": 7}, False, False),
    ("time-without-zone", {"start": "2026-11-29T15:59:00"}, False, False),
    ("time-unreadable", {"end": "yesterday"}, False, False),
    ("time-not-string", {"start": 1764431940}, False, False),
    ("time-too-long", {"start": "2026-11-29T15:59:00." + "0" * 50 + "Z"}, False, False),
    ("offset-with-seconds", {"start": "2026-11-29T15:59:00+00:00:30"}, False, False),
    ("before-year-1-in-utc", {"start": "0001-01-01T00:00:00+14:00"}, False, False),
    ("util-above-100", {"gpu_util_percent": 100.5}, False, False),
    ("util-negative", {"gpu_util_percent": -1}, False, False),
    ("util-text", {"gpu_util_percent": "50"}, False, False),
    ("util-boolean", {"gpu_util_percent": True}, False, False),
    ("memory-negative", {"memory_used_mib": -1}, False, False),
    ("memory-fraction", {"memory_used_mib": 1.5}, False, False),
    ("memory-too-large", {"memory_used_mib": 2**31}, False, False),
    ("memory-boolean", {"memory_used_mib": False}, False, False),
    ("memory-whole-float", {"memory_used_mib": 1.0}, False, True),
    ("id-with-nul", {"sample_id": "ses_a\x00"}, False, True),
    ("time-with-nul", {"end": "2026-11-29T16:00:00\x00Z"}, False, False),
    ("end-before-start", {"start": "2026-11-29T16:00:00Z", "end": "2026-11-29T15:59:00Z"}, False, True),
    ("window-longer-than-allowed", {"start": "2026-11-29T15:49:59Z"}, False, True),
]


def sample(changes: dict) -> dict:
    built = {**GOOD, **changes}
    return {key: value for key, value in built.items() if value is not DROP}


def parser_accepts(body: dict) -> bool:
    try:
        parse_samples([body], max_window_seconds=shared.USAGE_MAX_WINDOW_SECONDS, now=NOW)
    except InvalidUsageSample as exc:
        assert exc.extra["index"] == 0
        return False
    return True


def schema_accepts(body: dict) -> bool:
    return not contract.problems(contract.USAGE, {"samples": [body]})


@pytest.mark.parametrize("reader", ["parse_samples", "schema"])
@pytest.mark.parametrize(("changes", "valid", "beyond_schema"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parser_and_schema_agree(reader, changes, valid, beyond_schema):
    body = sample(changes)
    if reader == "parse_samples":
        assert parser_accepts(body) is valid
    else:
        assert schema_accepts(body) is (valid or beyond_schema)


@pytest.mark.parametrize("reader", ["parse_samples", "schema"])
@pytest.mark.parametrize("body", ["sample", 7, None, ["a"]], ids=["string", "number", "null", "list"])
def test_a_sample_that_is_not_an_object_is_refused(reader, body):
    assert (parser_accepts(body) if reader == "parse_samples" else schema_accepts(body)) is False


def test_the_batch_limit_is_the_contract():
    too_many = [sample({})] * (shared.USAGE_MAX_SAMPLES_PER_CALL + 1)
    assert contract.problems(contract.USAGE, {"samples": too_many})
    with pytest.raises(Exception, match="at most 5000 usage samples"):
        parse_samples(too_many, max_window_seconds=shared.USAGE_MAX_WINDOW_SECONDS, now=NOW)
