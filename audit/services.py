"""Writing the audit trail: :func:`audit_record` appends one ``AuditRecord`` and emits its ``gshare.audit`` log line.

Every service that changes something a person or a program asked for calls :func:`audit_record` once, inside its
transaction (a change that rolls back leaves no row; the log line is emitted when the transaction commits). The
actor is taken from ``audit.context`` (the request, command or beat task being run) unless the service was given
one explicitly.

Secrets never reach a row: a field named in :data:`SECRET_FIELDS` is recorded as changed without its values, and
every string of a row is checked against the shapes secrets take here (JWTs, ``gsh_`` API tokens, PEM blocks, the
base64 of either, kubeconfig documents, long base64 runs); a string that matches is stored as ``[redacted]``.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal

from django.db import transaction
from django.db.models import Model, Subquery, Value
from django.db.models.functions import Coalesce

from audit import context
from audit.models import AuditRecord

#: One structured line per audit row (``extra={"audit": {...}}``, see :func:`log_facts`); never a secret. The rows
#: of :data:`LOGGER_ACTIONS` (the lines gShare wrote before the trail existed) keep this logger; every other row
#: is logged on its child ``gshare.audit.trail``, so a handler on ``gshare.audit`` receives both.
logger = logging.getLogger("gshare.audit")
trail_logger = logging.getLogger("gshare.audit.trail")

Action = AuditRecord.Action

#: Actions whose line is on ``gshare.audit`` itself (alerting rules written for those lines keep matching).
LOGGER_ACTIONS = frozenset({
    Action.CLUSTER_UPDATE, Action.CLUSTER_DEREGISTER, Action.OPERATOR_TOKENS_REVOKE, Action.OPERATOR_TOKEN_EXCHANGE,
    Action.OPERATOR_TOKEN_EXCHANGE_THROTTLED,
})

#: Fields whose values are secrets: a change is recorded as ``{"secret": true}``, never with a value.
SECRET_FIELDS = frozenset({
    "kubeconfig", "private_key_pem", "private_key", "token", "token_hash", "password", "secret", "api_token", "key_pem",
})
REDACTED = "[redacted]"

_SECRET_SHAPES = re.compile(
    r"eyJ[A-Za-z0-9_\-]{8,}"            # a JWT (or any base64 of a JSON object)
    r"|gsh_"                             # a gShare API token
    r"|-----BEGIN|-----END|%2D%2D%2D%2D%2D"  # PEM, raw or URL-encoded
    r"|LS0tLS1CRUdJT|LS0tLS1FTkQ"        # PEM in base64
    r"|client-key-data|client-certificate-data|certificate-authority-data|current-context"  # a kubeconfig
    r"|Y2xpZW50LWtleS1kYXRh|Y2VydGlmaWNhdGUtYXV0aG9yaXR5LWRhdGE|YXBpVmVyc2lvbj",          # ... in base64
)
# A long base64 run mixing upper case, lower case and digits: key or token material (hex digests and ids are not).
_LONG_RUN = re.compile(r"[A-Za-z0-9+/=_\-]{40,}")

#: ``AuditRecord.object_type`` per model label (other models: their model name).
OBJECT_TYPES = {
    "clusters.Cluster": "cluster", "storage.StoragePool": "storage_pool", "storage.Volume": "volume",
    "gpu_sessions.Session": "session", "gshare.SigningKey": "signing_key", "gshare.ApiToken": "api_token",
    "billing.Price": "price", "billing.Policy": "policy", "billing.LedgerEntry": "ledger_entry",
}
_ID_ATTRIBUTES = ("public_id", "kid", "key_id")


def _looks_secret(text: str) -> bool:
    if _SECRET_SHAPES.search(text):
        return True
    for run in _LONG_RUN.findall(text):
        if re.search(r"[A-Z]", run) and re.search(r"[a-z]", run) and re.search(r"[0-9]", run):
            return True
    return False


def plain(value):
    """A JSON-safe, secret-free copy of ``value``.

    Decimals become strings (exact), datetimes ISO 8601 in UTC, model instances their public id (or kid, key id,
    pk), sets and querysets sorted lists; any string that looks like a secret becomes ``[redacted]``.
    """
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return REDACTED if _looks_secret(value) else value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).isoformat() if value.tzinfo else value.isoformat()
    if isinstance(value, datetime.date | datetime.timedelta):
        return str(value)
    if isinstance(value, Model):
        return plain(_object_id(value))
    if isinstance(value, Mapping):
        return {plain(str(key)): plain(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((plain(item) for item in value), key=str)
    if isinstance(value, Iterable):
        return [plain(item) for item in value]
    return plain(str(value))


def _object_id(obj: Model) -> str:
    if hasattr(obj, "get_username"):
        return obj.get_username()
    for name in _ID_ATTRIBUTES:
        value = getattr(obj, name, None)
        if value:
            return str(value)
    return str(obj.pk)


def _change(field: str, pair) -> dict:
    if field in SECRET_FIELDS:
        return {"secret": True}
    if isinstance(pair, Mapping):
        old, new = pair.get("old"), pair.get("new")
    else:
        old, new = pair
    return {"old": plain(old), "new": plain(new)}


def snapshot(obj: Model, fields: Iterable[str]) -> dict:
    """``{field: value}`` of ``obj`` for ``fields`` (a foreign key as the related object, loaded if need be).

    For :func:`diff` and :func:`created`; many-to-many fields are left to the caller.
    """
    return {name: getattr(obj, name) for name in fields}


def diff(before: Mapping, after: Mapping) -> dict:
    """``{field: (old, new)}`` for the fields whose values differ between two :func:`snapshot`\\ s."""
    return {name: (before.get(name), after[name]) for name in after if not _same(before.get(name), after[name])}


def _same(a, b) -> bool:
    if isinstance(a, Decimal | int) and isinstance(b, Decimal | int) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b  # 1 and 1.000 are one amount
    return plain(a) == plain(b)


def created(values: Mapping) -> dict:
    """``{field: (None, value)}``: the changes of an object that did not exist before."""
    return {name: (None, value) for name, value in values.items()}


def _cluster_of(obj: Model | None, cluster) -> tuple:
    """``(public id, name)`` of the cluster a row is about ("" when none).

    When ``obj`` names a cluster that is not loaded, two subqueries of the row's ``INSERT`` instead (no query of
    their own; the saved row is read back only for its log line).
    """
    if cluster is None and obj is not None:
        if obj._meta.label == "clusters.Cluster":
            cluster = obj
        elif getattr(obj, "cluster_id", None) is not None:
            cluster = obj._state.fields_cache.get("cluster")
            if cluster is None:
                from django.apps import apps

                row = apps.get_model("clusters", "Cluster").objects.filter(pk=obj.cluster_id).order_by()
                return (Coalesce(Subquery(row.values("public_id")[:1]), Value("")),
                        Coalesce(Subquery(row.values("name")[:1]), Value("")))
    if cluster is None:
        return "", ""
    return cluster.public_id, cluster.name


def audit_record(
    *,
    action: str,
    obj: Model | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
    cluster=None,
    changes: Mapping | None = None,
    details: Mapping | None = None,
    actor: str | None = None,
    level: int = logging.INFO,
) -> AuditRecord:
    """Append one row to the audit trail and emit its ``gshare.audit`` line once the transaction commits.

    Args:
        action: an ``AuditRecord.Action`` value (``cluster_update`` ...).
        obj: the model instance acted on: its kind, id and name are taken from it (``object_*`` override them).
        object_type, object_id, object_repr: the object when it is not a model instance (an operator token: its
            ``jti``), or to override what ``obj`` gives.
        cluster: the ``clusters.Cluster`` the object belongs to (default: ``obj`` itself, or ``obj.cluster``).
        changes: ``{field: (old, new)}`` (or ``{"old", "new"}`` dicts); a field in :data:`SECRET_FIELDS` is
            stored without its values.
        details: other facts (JSON-safe after :func:`plain`); never a secret.
        actor: who, when the caller knows better than the context (``console:<user>``); None or ``system``: the
            context's actor (``audit.context.current_actor``).
        level: the log level of the line (``logging.WARNING`` for refusals worth an alert).

    Returns:
        The saved ``AuditRecord``.

    Raises:
        ValueError: ``action`` is not an ``AuditRecord.Action`` (a programming error).
    """
    record = _record_of(action=action, obj=obj, object_type=object_type, object_id=object_id, object_repr=object_repr,
                        cluster=cluster, changes=changes, details=details, actor=actor)
    record.save()
    if not isinstance(record.cluster, str):
        record._cluster_pending = True  # the subqueries' values are in the database, not on the instance yet
    transaction.on_commit(lambda: log_emit(record, level=level))
    return record


def audit_record_many(entries: list[dict]) -> list[AuditRecord]:
    """``audit_record`` for several rows in one ``INSERT`` (the queue admits several sessions per pass).

    Args:
        entries: each a dict of ``audit_record``'s keyword arguments except ``level`` (INFO); each ``obj`` with its
            cluster loaded, or ``cluster`` given (no subqueries in a bulk insert).

    Returns:
        The saved rows, in order.

    Raises:
        ValueError: an unknown action, or an entry whose cluster is not loaded.
    """
    records = [_record_of(**entry) for entry in entries]
    if any(not isinstance(record.cluster, str) for record in records):
        raise ValueError("audit_record_many needs each row's cluster loaded (pass cluster=)")
    AuditRecord.objects.bulk_create(records)
    transaction.on_commit(lambda: [log_emit(record) for record in records])
    return records


def _record_of(*, action: str, obj: Model | None = None, object_type: str = "", object_id: str = "", object_repr: str = "",
               cluster=None, changes: Mapping | None = None, details: Mapping | None = None, actor: str | None = None) -> AuditRecord:
    """The unsaved row ``audit_record`` writes."""
    if action not in AuditRecord.Action.values:
        raise ValueError(f"unknown audit action {action!r}: add it to AuditRecord.Action")
    scope = context.current()
    if not actor or actor == context.SYSTEM:
        actor = scope.resolve() if scope is not None else context.SYSTEM
    if obj is not None:
        object_type = object_type or OBJECT_TYPES.get(obj._meta.label, obj._meta.model_name)
        object_id = object_id or _object_id(obj)
        object_repr = object_repr or str(getattr(obj, "name", "") or "")
    cluster_id, cluster_name = _cluster_of(obj, cluster)
    record = AuditRecord(
        actor=plain(actor)[:200],
        action=str(action),
        object_type=object_type[:32],
        object_id=plain(str(object_id))[:64],
        object_repr=plain(str(object_repr))[:200],
        cluster=cluster_id,
        cluster_name=cluster_name,
        changes={name: _change(name, pair) for name, pair in (changes or {}).items()},
        details=plain(dict(details or {})),
        source_address=scope.source_address if scope is not None else None,
    )
    return record


def log_facts(record: AuditRecord) -> dict:
    """The ``extra={"audit": ...}`` dict of a row's log line.

    ``actor``, ``action``; ``cluster`` and ``cluster_name`` when the row has a cluster; ``object``
    (``<type>:<id>``) unless the object is that cluster itself; ``fields`` (the changed field names) when any;
    ``source_address`` for HTTP; then the row's ``details``.
    """
    facts = {"actor": record.actor, "action": record.action}
    if record.cluster:
        facts.update(cluster=record.cluster, cluster_name=record.cluster_name)
    if not (record.object_type == "cluster" and record.object_id == record.cluster):
        facts["object"] = f"{record.object_type}:{record.object_id}"
    if record.changes:
        facts["fields"] = sorted(record.changes)
    if record.source_address:
        facts["source_address"] = record.source_address
    facts.update(record.details)
    return facts


def log_emit(record: AuditRecord, *, level: int = logging.INFO) -> None:
    """Emit the log line of ``record`` (``gshare.audit``, or ``gshare.audit.trail`` for actions not in
    :data:`LOGGER_ACTIONS`): ``key=value`` pairs, the same facts in ``extra["audit"]``."""
    if getattr(record, "_cluster_pending", False):
        record.refresh_from_db(fields=["cluster", "cluster_name"])
        record._cluster_pending = False
    facts = log_facts(record)
    text = " ".join(f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}" for key, value in facts.items()
                    if not isinstance(value, dict))
    (logger if record.action in LOGGER_ACTIONS else trail_logger).log(level, "%s", text, extra={"audit": facts})
