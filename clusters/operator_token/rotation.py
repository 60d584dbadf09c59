"""Operator token rotation (push), its state and warnings, and revocation by credential generation.

* :func:`operator_token_push` mints a fresh token for one cluster and writes it into that cluster's Secret
  (``GSHARE_OPERATOR_NAMESPACE``/``GSHARE_OPERATOR_TOKEN_SECRET``, key ``internal-jwt``) through its apiserver,
  with the kubeconfig stored for it; the operator picks it up without a restart.
* :func:`operator_tokens_rotate` does that for every cluster that is due (``manage.py rotate_operator_tokens``
  and the daily beat task ``clusters.rotate_operator_tokens``).
* :func:`operator_token_state` is what the API and the console show: expiry, last rotation, and a warning.
* :func:`operator_tokens_revoke` bumps the cluster's credential generation: every token issued before is
  refused at once (401 ``token_revoked``).

The token itself is never logged, stored or returned (the Secret on the cluster is the only copy).
"""

from __future__ import annotations

import base64
import datetime
import logging
from dataclasses import dataclass
from typing import NoReturn

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.services import Action, audit_record
from clusters.errors import CLUSTER_NOT_FOUND, TOKEN_PUSH_FAILED, TOKEN_PUSH_FORBIDDEN, TOKEN_PUSH_NAMESPACE_MISSING, TOKEN_PUSH_REVOKED, TOKEN_PUSH_UNREACHABLE
from clusters.models import Cluster
from clusters.operator_refusals import REFUSAL_MEANINGS
from clusters.operator_token.tokens import IssuedToken, operator_token_expiry_record, operator_token_issue
from contract import CLUSTER_DEREGISTERED, OPERATOR_TOKEN_SECRET_KEY
from core.exceptions import ApplicationError, Conflict, NotFound
from core.layout import CONTROL_PLANE_SECRET_LABELS
from kube import Deadline, KubeError, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import SECRETS
from kube.kubeconfig import KubeconfigError

logger = logging.getLogger(__name__)

class Outcome:
    """Outcomes of one cluster's rotation (:attr:`TokenRotationResult.outcome`)."""

    ROTATED = "rotated"
    FAILED = "failed"
    SKIPPED = "skipped"
    WOULD_ROTATE = "would_rotate"


@dataclass(frozen=True)
class TokenRotationResult:
    """What a rotation did for one cluster. Never holds the token.

    Attributes:
        cluster_id: public id (``clu_...``).
        cluster_name: name.
        outcome: ``rotated``, ``failed``, ``skipped`` (not due) or ``would_rotate`` (dry run).
        generation: credential generation of the token pushed (or that would be pushed).
        expires_at: expiry of the token pushed (rotated), else of the newest token on record (or None).
        secret_action: ``created`` or ``replaced`` when rotated, else "".
        code: error code when failed (``token_push_unreachable``, ...), else "".
        detail: a sentence: why it failed (and the fix), why it was skipped, or what was done.
    """

    cluster_id: str
    cluster_name: str
    outcome: str
    generation: int
    expires_at: datetime.datetime | None
    secret_action: str = ""
    code: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        """False only for ``failed``."""
        return self.outcome != Outcome.FAILED


class OperatorTokenPushFailed(ApplicationError):
    """502: the token could not be written into the cluster's Secret; the failure is recorded on the cluster.

    ``code`` is one of ``token_push_unreachable`` (the apiserver did not answer), ``token_push_forbidden``
    (401/403: the stored kubeconfig lacks the right to write the Secret), ``token_push_namespace_missing``
    (the operator's namespace does not exist: the operator is not installed), ``token_push_revoked`` (the
    cluster's tokens were revoked while pushing) or ``token_push_failed`` (anything else). ``result`` is the
    :class:`TokenRotationResult`.
    """

    code = TOKEN_PUSH_FAILED
    status = 502

    def __init__(self, detail: str, *, code: str, result: TokenRotationResult):
        super().__init__(detail, code=code)
        self.result = result


class OperatorTokenPushUnavailable(OperatorTokenPushFailed):
    """502: the push failed for a reason that may pass (the apiserver did not answer, was cut off, or answered 5xx/429):
    the Celery retry task tries it again (``clusters.tasks.retry_operator_token_push``)."""


@dataclass(frozen=True)
class OperatorTokenState:
    """A cluster's operator token as the API and the console show it (no secret).

    Attributes:
        expires_at: expiry of the newest token issued for the current generation (None: none on record).
        rotated_at: when a rotation last wrote a token into the cluster's Secret (None: never).
        last_rotation_error: why the last rotation failed ("" when it succeeded or never ran).
        warning: None, or a sentence naming the problem and the fix.
        refused_since: since when the operator's callbacks are refused (``clusters.operator_refusals``), or None.
        refused_reason: the latest refusal's reason code (``token_expired``, ``token_revoked``, ...), or "".
    """

    expires_at: datetime.datetime | None
    rotated_at: datetime.datetime | None
    last_rotation_error: str
    warning: str | None
    refused_since: datetime.datetime | None = None
    refused_reason: str = ""


def _rotate_command(cluster: Cluster) -> str:
    return f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`"


def _when(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds >= 7200:
        return f"{seconds // 3600} hours"
    return f"{seconds // 60} minutes"


def operator_token_state(cluster: Cluster, *, now: datetime.datetime | None = None) -> OperatorTokenState:
    """The operator token facts of ``cluster`` and a warning when something needs doing. No query.

    A warning is given (never for a deregistered cluster) when the operator's callbacks are being refused
    (``Cluster.operator_refused_since``: "Operator callbacks refused since <time> UTC (<reason>): <fix>", followed
    by any of the warnings below), when the last rotation failed, when no token is on record (never
    issued through the control plane, or revoked), when the newest token has expired, or when it expires within
    ``GSHARE_OPERATOR_TOKEN_WARN_BEFORE`` seconds (default 3 days).

    Args:
        cluster: the cluster (its loaded fields are used as they are).
        now: the time to judge against (default: now).

    Returns:
        An :class:`OperatorTokenState`.
    """
    now = now or timezone.now()
    expires_at = cluster.operator_token_expires_at
    error = cluster.operator_token_rotation_error
    refused_since, refused_reason = cluster.operator_refused_since, cluster.operator_refused_reason
    warning = None
    if cluster.status != Cluster.Status.DEREGISTERED:
        if error:
            attempted = cluster.operator_token_rotation_attempted_at
            still = (
                f"the operator's newest token expires at {_when(expires_at)}" if expires_at and expires_at > now
                else "the operator may have no valid token"
            )
            warning = (
                f"The last operator token rotation{' at ' + _when(attempted) if attempted else ''} failed ({error.rstrip('.')}); "
                f"{still}. Fix the cause, then run {_rotate_command(cluster)} (the daily rotation also retries)."
            )
        elif expires_at is None:
            warning = (
                "No operator token is on record for this cluster (none issued by the control plane yet, or its tokens were "
                f"revoked), so its operator cannot report: push one with {_rotate_command(cluster)}."
            )
        elif expires_at <= now:
            warning = (
                f"The operator token expired at {_when(expires_at)} and the operator can no longer report: push a new one "
                f"with {_rotate_command(cluster)}."
            )
        elif (expires_at - now).total_seconds() < settings.GSHARE_OPERATOR_TOKEN_WARN_BEFORE:
            warning = (
                f"The operator token expires at {_when(expires_at)} (in {_duration((expires_at - now).total_seconds())}) and "
                f"has not been renewed: check that Celery beat and a worker run, then run {_rotate_command(cluster)}."
            )
        if refused_since is not None:
            # The refusal is what stops the operator now, so it comes first; the warning about the token on record
            # (or the failed rotation, which says why the fix may fail again) follows it.
            refused = _refused_warning(cluster, since=refused_since, reason=refused_reason)
            warning = f"{refused} {warning}" if warning else refused
    return OperatorTokenState(
        expires_at=expires_at, rotated_at=cluster.operator_token_rotated_at, last_rotation_error=error, warning=warning,
        refused_since=refused_since, refused_reason=refused_reason,
    )


def _refused_warning(cluster: Cluster, *, since: datetime.datetime, reason: str) -> str:
    """"Operator callbacks refused since <time> UTC (<reason>): <fix>." for a cluster with recorded refusals."""
    code = reason or "refused"
    meaning = REFUSAL_MEANINGS.get(reason)
    latest = cluster.operator_refused_at
    detail = f"{code}: {meaning}" if meaning else code
    if latest and latest != since:
        detail += f"; latest at {_when(latest)}"
    sentence = (
        f"Operator callbacks refused since {_when(since)} ({detail}): rotate the operator token with "
        f"{_rotate_command(cluster)} or the console's “Rotate the operator token now” action; the operator picks the new "
        "token up without a restart."
    )
    rotated = cluster.operator_token_rotated_at
    if rotated and latest and rotated > latest:
        sentence += f" A token was pushed at {_when(rotated)}, after the latest refusal: this clears at the operator's next accepted callback."
    return sentence


def operator_token_rotation_due(cluster: Cluster, *, now: datetime.datetime | None = None) -> tuple[bool, str]:
    """Whether the daily rotation should push a token to ``cluster`` now. No query.

    Due when the last rotation failed, when no token is on record (never issued, or revoked), when the
    token expires within ``GSHARE_OPERATOR_TOKEN_WARN_BEFORE``, or when no rotation succeeded in the last
    ``GSHARE_OPERATOR_TOKEN_ROTATE_MIN_AGE`` seconds (12 h): a second run the same day changes nothing.

    Returns:
        ``(due, reason)``; ``reason`` is a short phrase for the command's output.
    """
    now = now or timezone.now()
    if cluster.operator_token_rotation_error:
        return True, "the last rotation failed"
    if cluster.operator_token_expires_at is None:
        return True, "no token on record"
    if (cluster.operator_token_expires_at - now).total_seconds() < settings.GSHARE_OPERATOR_TOKEN_WARN_BEFORE:
        return True, "the token expires soon"
    rotated = cluster.operator_token_rotated_at
    if rotated is None:
        return True, "never rotated"
    age = (now - rotated).total_seconds()
    if age >= settings.GSHARE_OPERATOR_TOKEN_ROTATE_MIN_AGE:
        return True, f"last rotated {_duration(age)} ago"
    return False, f"rotated {_duration(age)} ago"


def _secret_write(kube: KubeGateway, *, namespace: str, name: str, token: str) -> str:
    """Create or replace the Secret's ``internal-jwt`` key (other keys and metadata are kept).

    Replaces with the ``resourceVersion`` read, so a concurrent writer (the operator's own refresh) is never
    overwritten blindly: a 409 reads again, at most three times. Every call is bounded as a whole by what is
    left of the gateway's deadline: a server that trickles its answer is cut off when it is spent.

    Returns:
        ``created`` or ``replaced``.

    Raises:
        KubeUnavailable, KubeRefused: from the gateway (a third 409 is the last refusal).
    """
    encoded = base64.b64encode(token.encode()).decode()
    last: KubeRefused | None = None
    for _ in range(3):
        current = kube.get(SECRETS, name, namespace=namespace, missing_ok=True)
        if current is None:
            body = {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(CONTROL_PLANE_SECRET_LABELS)},
                "data": {OPERATOR_TOKEN_SECRET_KEY: encoded},
            }
            try:
                kube.create(body)
                return "created"
            except KubeRefused as exc:
                if exc.status != 409:  # 409: created meanwhile; read it and replace it
                    raise
                last = exc
                continue
        body = {**current, "data": {**(current.get("data") or {}), OPERATOR_TOKEN_SECRET_KEY: encoded}}
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "Secret")
        body.pop("stringData", None)
        try:
            kube.replace(body)
            return "replaced"
        except KubeRefused as exc:
            if exc.status != 409:  # 409: changed since read; read again
                raise
            last = exc
    assert last is not None
    raise last


def _push_failure(cluster: Cluster, exc: Exception, *, namespace: str, name: str, timeout: float) -> tuple[str, str]:
    """``(code, sentence naming the fix)`` for a failure of the Secret write (a ``KubeconfigError`` or ``KubeError``)."""
    where = f"Secret {namespace}/{name} on {cluster.name}"
    if isinstance(exc, KubeconfigError):
        return TOKEN_PUSH_FAILED, f"{exc.detail.rstrip('.')}; register the cluster's kubeconfig again"
    assert isinstance(exc, KubeError)
    if isinstance(exc, KubeRefused) and exc.unreadable:
        return TOKEN_PUSH_FAILED, (
            f"The apiserver at {cluster.apiserver_url} gave an answer the Kubernetes client could not read ({exc.message}) "
            f"when writing the {where}: check that the kubeconfig names a Kubernetes apiserver"
        )
    if exc.status:
        if exc.status in (401, 403):
            return TOKEN_PUSH_FORBIDDEN, (
                f"The cluster's apiserver refused to let the control plane write the {where} ({exc.status} {exc.reason}): "
                f"the control plane's ServiceAccount may get and update that Secret but not create it, so when it is missing "
                f"re-run the attach (which creates it) or create it empty: `kubectl -n {namespace} create secret generic {name}`; "
                "otherwise give the credential get and update on it (docs/rotation.md)"
            )
        if exc.status == 404:
            return TOKEN_PUSH_NAMESPACE_MISSING, (
                f"Namespace {namespace} does not exist on {cluster.name}, so the {where} cannot be written: install the "
                "operator chart (docs/attach-a-cluster.md)"
            )
        return TOKEN_PUSH_FAILED, f"The apiserver answered {exc.status} {exc.reason} when writing the {where}: check the apiserver"
    assert isinstance(exc, KubeUnavailable)
    if exc.tls_detail:
        return TOKEN_PUSH_FAILED, f"{exc.tls_detail.rstrip('.')} (when writing the {where}); register the cluster's kubeconfig again"
    if exc.deadline_exceeded:
        return TOKEN_PUSH_UNREACHABLE, (
            f"The apiserver at {cluster.apiserver_url} did not answer within {timeout:g} s when writing the {where}: no "
            "complete answer came in that time (the connection was cut off at the deadline); check that the control plane "
            "can reach it, that the address is the apiserver's, and that the cluster is up"
        )
    return TOKEN_PUSH_UNREACHABLE, (
        f"The apiserver at {cluster.apiserver_url} did not answer within {timeout:g} s ({exc.cause_name}) when "
        f"writing the {where}: check that the control plane can reach it and that the cluster is up"
    )


def operator_token_push(cluster: Cluster, *, ttl: int | None = None) -> TokenRotationResult:
    """Mint a fresh token for ``cluster``'s operator and write it into the cluster's Secret.

    Writes ``GSHARE_OPERATOR_NAMESPACE``/``GSHARE_OPERATOR_TOKEN_SECRET`` (defaults ``gshare-system`` /
    ``gshare-operator-internal-jwt``), key ``internal-jwt``, through the cluster's apiserver with its stored
    kubeconfig: created when missing, else replaced (other keys kept). All apiserver calls share
    ``GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT`` seconds. No row lock is held while the apiserver is dialled.

    Records on the cluster: ``operator_token_rotation_attempted_at`` always; on success also
    ``operator_token_rotated_at``, ``operator_token_expires_at`` and an empty ``operator_token_rotation_error``;
    on failure the error sentence. Tokens issued before stay valid until they expire (unless revoked). Call it
    outside a transaction that may roll back, or the recorded failure is rolled back with it.

    Args:
        cluster: a cluster that is not deregistered.
        ttl: lifetime of the new token in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800 = 7 days).

    Returns:
        A :class:`TokenRotationResult` with outcome ``rotated`` (and ``secret_action`` ``created``/``replaced``).

    Raises:
        OperatorTokenPushFailed: 502 with code ``token_push_unreachable``, ``token_push_forbidden``,
            ``token_push_namespace_missing``, ``token_push_revoked`` or ``token_push_failed``; the failure
            is recorded first and ``exc.result`` holds the failed result. ``OperatorTokenPushUnavailable`` (a subclass)
            when it may pass: the apiserver did not answer or answered 5xx/429.
        Conflict: ``cluster_deregistered`` (409); nothing is recorded.
        ApplicationError: ``invalid_ttl`` (400).
    """
    cluster = Cluster.objects.get(pk=cluster.pk)  # the current generation and status
    issued = operator_token_issue(cluster=cluster, ttl=ttl)
    namespace, name = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_OPERATOR_TOKEN_SECRET
    timeout = settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT
    attempted_at = timezone.now()
    try:
        kube = KubeGateway.for_cluster(cluster, deadline=Deadline(timeout))
    except KubeconfigError as exc:
        code, detail = _push_failure(cluster, exc, namespace=namespace, name=name, timeout=timeout)
        _push_failed(cluster, issued, code=code, detail=detail, attempted_at=attempted_at)
    try:
        with kube:
            action = _secret_write(kube, namespace=namespace, name=name, token=issued.token)
    except KubeError as exc:
        code, detail = _push_failure(cluster, exc, namespace=namespace, name=name, timeout=timeout)
        transient = isinstance(exc, KubeUnavailable) and not exc.tls_detail
        _push_failed(cluster, issued, code=code, detail=detail, attempted_at=attempted_at, transient=transient)
    recorded = operator_token_expiry_record(
        cluster=cluster, issued=issued,
        operator_token_rotated_at=timezone.now(), operator_token_rotation_attempted_at=attempted_at, operator_token_rotation_error="",
    )
    if not recorded:
        _push_failed(
            cluster, issued, code=TOKEN_PUSH_REVOKED, attempted_at=attempted_at,
            detail="The cluster's operator tokens were revoked (or it was deregistered) while this token was pushed, so it is already refused: rotate again",
        )
    audit_record(action=Action.OPERATOR_TOKEN_ROTATE, object_type="operator_token", object_id=issued.jti, cluster=cluster, details={
        "generation": issued.generation, "expires_at": issued.expires_at, "kubernetes_secret": f"{namespace}/{name}", "secret_action": action,
    })
    logger.info(
        "operator token rotated: cluster %s (%s), Secret %s/%s %s, generation %d, expires %s",
        cluster.public_id, cluster.name, namespace, name, action, issued.generation, issued.expires_at.isoformat(),
    )
    return TokenRotationResult(
        cluster_id=cluster.public_id, cluster_name=cluster.name, outcome=Outcome.ROTATED, generation=issued.generation,
        expires_at=issued.expires_at, secret_action=action, detail=f"Secret {namespace}/{name} {action}",
    )


def _push_failed(cluster: Cluster, issued: IssuedToken, *, code: str, detail: str, attempted_at: datetime.datetime,
                 transient: bool = False) -> NoReturn:
    """Record a failed push on the cluster and raise :class:`OperatorTokenPushFailed` (:class:`OperatorTokenPushUnavailable`
    when ``transient``)."""
    detail = detail.rstrip(".") + "."
    Cluster.objects.filter(pk=cluster.pk).update(operator_token_rotation_attempted_at=attempted_at, operator_token_rotation_error=detail)
    logger.warning("operator token rotation failed: cluster %s (%s): %s %s", cluster.public_id, cluster.name, code, detail)
    audit_record(action=Action.OPERATOR_TOKEN_ROTATE_FAILED, object_type="operator_token", object_id=issued.jti, cluster=cluster,
                 details={"generation": issued.generation, "code": code, "detail": detail[:500]}, level=logging.WARNING)
    result = TokenRotationResult(
        cluster_id=cluster.public_id, cluster_name=cluster.name, outcome=Outcome.FAILED, generation=issued.generation,
        expires_at=cluster.operator_token_expires_at, code=code, detail=detail,
    )
    error = OperatorTokenPushUnavailable if transient else OperatorTokenPushFailed
    raise error(f"{detail} Then run {_rotate_command(cluster)}.", code=code, result=result)


def operator_tokens_rotate(*, cluster_id: str | None = None, dry_run: bool = False, force: bool = False) -> list[TokenRotationResult]:
    """Push a fresh token to every cluster that is due (or to one cluster), one cluster at a time.

    Every cluster that is not deregistered is considered, pending and unreachable ones included (a
    failure is recorded and shown as a warning). Without ``cluster_id`` and ``force``, a cluster is
    skipped unless :func:`operator_token_rotation_due`; so the daily run is idempotent. One cluster's
    failure does not stop the others.

    Args:
        cluster_id: only this cluster (``clu_...``), rotated whether due or not.
        dry_run: change nothing and dial nothing; report ``would_rotate``/``skipped`` per cluster.
        force: rotate every cluster, due or not.

    Returns:
        One :class:`TokenRotationResult` per cluster considered, in name order.

    Raises:
        NotFound: ``cluster_not_found`` (404) for an unknown ``cluster_id``.
        Conflict: ``cluster_deregistered`` (409) when ``cluster_id`` names a deregistered cluster.
    """
    now = timezone.now()
    if cluster_id is not None:
        cluster = Cluster.objects.filter(public_id=cluster_id).first()
        if cluster is None:
            raise NotFound(f"No cluster has the id {cluster_id!r}: list them with `GET /api/v1/clusters`.", code=CLUSTER_NOT_FOUND)
        if cluster.status == Cluster.Status.DEREGISTERED:
            raise Conflict(f"Cluster {cluster.name} ({cluster_id}) is deregistered: its operator needs no token.", code=CLUSTER_DEREGISTERED)
        clusters, force = [cluster], True
    else:
        clusters = list(Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED).order_by("name", "id"))
    results = []
    for cluster in clusters:
        due, reason = operator_token_rotation_due(cluster, now=now)
        if not (due or force):
            results.append(_unchanged(cluster, Outcome.SKIPPED, f"not due: {reason}"))
        elif dry_run:
            results.append(_unchanged(cluster, Outcome.WOULD_ROTATE, "forced" if force and not due else reason))
        else:
            try:
                results.append(operator_token_push(cluster))
            except OperatorTokenPushFailed as exc:
                results.append(exc.result)
            except Conflict:  # deregistered meanwhile
                results.append(_unchanged(cluster, Outcome.SKIPPED, "deregistered meanwhile"))
    return results


def _unchanged(cluster: Cluster, outcome: str, detail: str) -> TokenRotationResult:
    return TokenRotationResult(
        cluster_id=cluster.public_id, cluster_name=cluster.name, outcome=outcome, generation=cluster.credential_generation,
        expires_at=cluster.operator_token_expires_at, detail=detail,
    )


def operator_token_push_retry(*, cluster_id: str) -> TokenRotationResult | None:
    """Retry a failed push (the Celery retry task): push again only if it is still needed.

    Returns:
        The result of the push, or None when there is nothing to retry (the cluster is gone or
        deregistered, or a rotation succeeded since).

    Raises:
        OperatorTokenPushFailed: as :func:`operator_token_push`.
    """
    cluster = Cluster.objects.filter(public_id=cluster_id).exclude(status=Cluster.Status.DEREGISTERED).first()
    if cluster is None or not cluster.operator_token_rotation_error:
        return None
    try:
        return operator_token_push(cluster)
    except Conflict:
        return None


@transaction.atomic
def credential_generation_bump(*, cluster: Cluster, actor: str, action: str, changes: dict | None = None) -> int:
    """Bump ``cluster``'s credential generation: every operator token issued before is refused from now on.

    One ``UPDATE ... SET credential_generation = credential_generation + 1`` (no lost update under
    concurrency); the recorded token expiry is cleared (no valid token remains). Writes one audit row (its
    ``gshare.audit`` line once the transaction commits).

    Args:
        cluster: the cluster; its ``credential_generation`` and ``operator_token_expires_at`` are updated in place.
        actor: who asked (``command:<name>``, ``console:<user>``, ``api:<user>`` ...).
        action: what (``operator_tokens_revoke``, ``cluster_deregister``).
        changes: more changed fields for the audit row (``{field: (old, new)}``, e.g. the deregistration's status).

    Returns:
        The new generation.
    """
    Cluster.objects.filter(pk=cluster.pk).update(credential_generation=F("credential_generation") + 1, operator_token_expires_at=None)
    generation = Cluster.objects.filter(pk=cluster.pk).values_list("credential_generation", flat=True).get()
    cluster.credential_generation, cluster.operator_token_expires_at = generation, None
    audit_record(action=action, obj=cluster, actor=actor, changes=changes, details={"generation": generation})
    return generation


def operator_tokens_revoke(*, cluster_id: str, actor: str) -> int:
    """Revoke every operator token of a cluster at once (``manage.py revoke_operator_tokens``).

    The next rotation (daily, or ``manage.py rotate_operator_tokens --cluster <id>``) pushes a token of the
    new generation; until then the operator is refused with 401 ``token_revoked``.

    Args:
        cluster_id: public id (``clu_...``).
        actor: who asked, for the audit line.

    Returns:
        The cluster's new credential generation.

    Raises:
        NotFound: ``cluster_not_found`` (404).
    """
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(public_id=cluster_id).first()
        if cluster is None:
            raise NotFound(f"No cluster has the id {cluster_id!r}: list them with `GET /api/v1/clusters`.", code=CLUSTER_NOT_FOUND)
        return credential_generation_bump(cluster=cluster, actor=actor, action="operator_tokens_revoke")
