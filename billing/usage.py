"""Parsing of operator usage samples (``POST /internal/v1/usage``): a hand-written loop, no jsonschema.

A batch holds up to 5,000 samples and the endpoint's goal is tens of thousands of samples per second, so each
sample is checked with plain type tests and ``datetime.fromisoformat`` (a per-sample jsonschema validation costs
more than the whole database write). The first offending sample refuses the batch with its index.

The checks are those of ``contract.USAGE_SCHEMA`` plus what a schema cannot say (end after start,
the window's length and age); times are RFC 3339 as ``contract.rfc3339.parse`` reads them, inlined here so a
well-formed sample costs one ``fromisoformat`` per time. ``tests/billing/test_usage_contract.py`` runs one table of
samples through this parser, the schema and ``rfc3339.parse``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import contract
from billing.exceptions import BatchTooLarge, InvalidUsageSample
from contract.rfc3339 import MAX_LENGTH as _MAX_TIME_LENGTH
from contract.rfc3339 import offset_in_whole_minutes
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError

#: At most this many samples per ``POST /internal/v1/usage`` (400 ``batch_too_large`` beyond; shared with the operator).
MAX_BATCH = contract.USAGE_MAX_SAMPLES_PER_CALL
#: Longest ``sample_id``, ``session_id`` and ``device_uuid`` (the columns' size).
MAX_ID_LENGTH = contract.USAGE_ID_MAX_LENGTH
_MAX_INT = 2**31 - 1
_REQUIRED = ("sample_id", "session_id", "device_uuid", "start", "end")
_fromisoformat = datetime.fromisoformat




class Sample(NamedTuple):
    """One validated sample. ``start``/``end`` are aware datetimes in UTC (whatever offset the operator sent);
    ``micros`` is ``end - start`` in microseconds; ``gpu_util_percent`` is the number's text (stored as ``numeric(6, 2)``)."""

    index: int
    sample_id: str
    session_id: str
    device_uuid: str
    start: datetime
    end: datetime
    micros: int
    gpu_util_percent: str | None
    memory_used_mib: int | None


#: ``reason`` of an ``invalid_usage_sample`` refusal that is about the usage, not the format (absent for malformed
#: samples). The code stays ``invalid_usage_sample``: operators drop exactly that sample on that code and resend the
#: rest, and would keep (and resend forever) a batch refused with any other 400 code.
USAGE_WINDOW_OVERLAP = "usage_window_overlap"
USAGE_WINDOW_BEFORE_SESSION = "usage_window_before_session"
USAGE_DEVICE_NOT_ALLOCATED = "usage_device_not_allocated"
USAGE_WINDOW_AFTER_SESSION = "usage_window_after_session"


def invalid_sample(index: int, sample, problem: str, *, reason: str | None = None) -> InvalidUsageSample:
    """The 400 for sample ``index``: names the sample (its ``sample_id`` when readable) and the problem.

    ``reason`` (one of the ``USAGE_*`` values above) is added to the body for refusals of well-formed samples."""
    name = sample.get("sample_id") if isinstance(sample, dict) else None
    label = f"samples[{index}]" + (f" (sample_id {name!r})" if isinstance(name, str) and len(name) <= MAX_ID_LENGTH else "")
    if reason:
        return InvalidUsageSample(
            f"Usage sample {label} is refused: {problem}. Nothing of this batch was stored: drop that sample and send the "
            "batch again.",
            extra={"index": index, "reason": reason},
        )
    return InvalidUsageSample(
        f"Usage sample {label} is malformed: {problem}. Nothing of this batch was stored: fix or drop that sample "
        "(upgrade the operator to match this control plane) and send the batch again.",
        extra={"index": index},
    )


def _bad_text(value) -> str | None:
    """Why ``value`` cannot be an id (None when it can)."""
    if type(value) is not str:
        return f"must be a string, not {type(value).__name__}"
    if not value or len(value) > MAX_ID_LENGTH:
        return f"must be 1 to {MAX_ID_LENGTH} characters long"
    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains an unpaired surrogate, which cannot be stored"
    return None


def _time(value) -> datetime | None:
    if type(value) is not str or len(value) > _MAX_TIME_LENGTH or not value.isprintable():
        return None
    try:
        parsed = _fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


#: Seconds a sample's end may lie ahead of the control plane's clock.
CLOCK_SKEW_SECONDS = 300


def parse_samples(samples, *, max_window_seconds: int, max_age_seconds: int = 30 * 86400,
                  now: datetime | None = None) -> list[Sample]:
    """Check every sample of a batch and return them parsed, in order (duplicates included).

    Each sample is ``{"sample_id", "session_id", "device_uuid", "start", "end", "gpu_util_percent"?,
    "memory_used_mib"?}``: ids are strings of 1 to 128 characters (a ``sample_id`` not beginning with ``gap:``); ``start``/``end`` ISO 8601 times with a zone
    (``2026-11-29T16:00:00Z``; an offset in whole minutes, up to ±23:59, is converted to UTC; one with seconds is
    refused), ``end`` after ``start`` and at most ``max_window_seconds`` later, the window
    within ``max_age_seconds`` before ``now`` and ``CLOCK_SKEW_SECONDS`` after it (UTC; a year-10000 window
    would otherwise be stored and could not be read back);
    ``gpu_util_percent`` a number 0 to 100 or null; ``memory_used_mib`` a whole number >= 0 or null.

    Raises:
        BatchTooLarge: ``batch_too_large`` (400) for more than ``MAX_BATCH`` samples.
        InvalidUsageSample: ``invalid_usage_sample`` (400) with ``index``, for the first malformed sample.
    """
    if type(samples) is not list:
        raise ApplicationError('The body must be {"samples": [...]}: a list of usage samples.', code=INVALID_REQUEST)
    if len(samples) > MAX_BATCH:
        raise BatchTooLarge(f"A batch holds at most {MAX_BATCH} usage samples; this one has {len(samples)}: send them in smaller batches.")
    max_micros = max_window_seconds * 1_000_000
    now = now or datetime.now(UTC)
    earliest, latest = now - timedelta(seconds=max_age_seconds), now + timedelta(seconds=CLOCK_SKEW_SECONDS)
    parsed = []
    append = parsed.append
    fromiso = _fromisoformat
    for index, sample in enumerate(samples):
        if type(sample) is not dict:
            raise invalid_sample(index, sample, f"must be an object, not {type(sample).__name__}")
        try:
            sample_id = sample["sample_id"]
            session_id = sample["session_id"]
            device_uuid = sample["device_uuid"]
            start_raw = sample["start"]
            end_raw = sample["end"]
        except KeyError:
            missing = [key for key in _REQUIRED if key not in sample]
            raise invalid_sample(index, sample, f"{', '.join(missing)} missing") from None
        # Fast path: three short ASCII strings without NUL (the slow path says what is wrong).
        if not (
            type(sample_id) is str and type(session_id) is str and type(device_uuid) is str
            and 0 < len(sample_id) <= MAX_ID_LENGTH and 0 < len(session_id) <= MAX_ID_LENGTH and 0 < len(device_uuid) <= MAX_ID_LENGTH
            and sample_id.isascii() and session_id.isascii() and device_uuid.isascii()
            and "\x00" not in sample_id and "\x00" not in session_id and "\x00" not in device_uuid
        ):
            for key, value in (("sample_id", sample_id), ("session_id", session_id), ("device_uuid", device_uuid)):
                problem = _bad_text(value)
                if problem:
                    raise invalid_sample(index, sample, f"{key} {problem}")
        if sample_id.startswith(contract.USAGE_RESERVED_ID_PREFIX):
            raise invalid_sample(index, sample, f"sample_id may not begin with {contract.USAGE_RESERVED_ID_PREFIX!r}: the control plane's "
                                                "own rows of held time not sampled use it")
        try:
            # isprintable: fromisoformat reads a time with a NUL before its "Z" (rfc3339.parse refuses it too).
            start = fromiso(start_raw) if type(start_raw) is str and len(start_raw) <= _MAX_TIME_LENGTH and start_raw.isprintable() else None
            end = fromiso(end_raw) if type(end_raw) is str and len(end_raw) <= _MAX_TIME_LENGTH and end_raw.isprintable() else None
        except ValueError:
            start = end = None
        if start is None or end is None or start.tzinfo is None or end.tzinfo is None:
            start, end = _time(start_raw), _time(end_raw)
            key, raw = ("start", start_raw) if start is None else ("end", end_raw)
            shown = repr(raw) if type(raw) is not str or len(raw) <= _MAX_TIME_LENGTH else repr(raw[:_MAX_TIME_LENGTH] + "...")
            raise invalid_sample(index, sample, f"{key} must be an ISO 8601 time with a zone, e.g. 2026-11-29T16:00:00Z; got {shown}")
        if not (offset_in_whole_minutes(start_raw) and offset_in_whole_minutes(end_raw)):
            key, raw = ("start", start_raw) if not offset_in_whole_minutes(start_raw) else ("end", end_raw)
            raise invalid_sample(
                index, sample,
                f"{key} has a UTC offset with seconds ({raw!r}); send UTC (2026-11-29T16:00:00Z) or an offset in whole minutes (+05:30)",
            )
        try:
            start_utc, end_utc = start.astimezone(UTC), end.astimezone(UTC)
        except OverflowError:
            start_utc = end_utc = None
        if start_utc is None or start_utc < earliest or end_utc > latest:
            raise invalid_sample(
                index, sample,
                f"the window {str(start_raw)[:40]} .. {str(end_raw)[:40]} is not between {earliest:%Y-%m-%dT%H:%M:%SZ} "
                f"(GSHARE_USAGE_MAX_AGE_SECONDS ago) and {latest:%Y-%m-%dT%H:%M:%SZ} (now plus {CLOCK_SKEW_SECONDS} s of clock "
                "skew): check the operator node's clock",
            )
        delta = end_utc - start_utc
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        if micros <= 0:
            raise invalid_sample(index, sample, f"end ({end_raw}) must be after start ({start_raw})")
        if micros > max_micros:
            raise invalid_sample(
                index, sample,
                f"the window {start_raw} .. {end_raw} is longer than {max_window_seconds} s (GSHARE_USAGE_MAX_WINDOW_SECONDS): "
                "send one sample per sampling interval",
            )
        util = sample.get("gpu_util_percent")
        if util is not None:
            kind = type(util)
            if (kind is not int and kind is not float) or not 0 <= util <= 100:
                raise invalid_sample(index, sample, f"gpu_util_percent must be a number from 0 to 100 or null; got {util!r}"[:300])
            util = str(util)
        memory = sample.get("memory_used_mib")
        if memory is not None and (type(memory) is not int or not 0 <= memory <= _MAX_INT):
            raise invalid_sample(index, sample, f"memory_used_mib must be a whole number of MiB, at least 0, or null; got {memory!r}"[:300])
        # The UTC values go on (checks, COPY, range queries): PostgreSQL allows offsets of at most 15:59, so the text
        # of a +20:00 time would fail the batch with a 500 (and the operator would resend it forever).
        append(Sample(index, sample_id, session_id, device_uuid, start_utc, end_utc, micros, util, memory))
    return parsed
