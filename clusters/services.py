"""Cluster services: registration, updates, deregistration, connection test, inventory ingest.

These are the only functions that change clusters, nodes and GPU devices; the API, the console,
the management commands and the Celery tasks call them.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import timedelta

import yaml
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

import contract
from audit.services import Action, audit_record, created
from clusters import inventory, signals
from clusters.diagnosis import clock_verdict, operator_check_verdicts, operator_reporting_detail
from clusters.errors import (
    CLUSTER_ALREADY_REGISTERED,
    CLUSTER_BUSY,
    CLUSTER_HAS_LIVE_SESSIONS,
    CLUSTER_IDENTITY_UNKNOWN,
    CLUSTER_PREREQUISITE_MISSING,
    DIFFERENT_CLUSTER,
    HAMI_MISSING,
    NAME_TAKEN,
    RUNTIME_CLASS_MISSING,
    SESSION_DOMAIN_TAKEN,
)
from clusters.models import Cluster, GpuDevice, Node, node_summary_update_sql
from clusters.operator_token.rotation import credential_generation_bump
from clusters.probe import ClusterAuthFailed, ClusterUnreachable, probe_cluster
from clusters.routing_mode import ROUTING_FIELDS, routing_key, routing_probe, routing_settings_refusal, session_domain_refusal
from contract import CLOCK_SYNCED, FORBIDDEN_CLUSTER_SCOPE, INVENTORY_SNAPSHOT_REQUIRED, OPERATOR_CHECKS
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict, Forbidden
from kube.kubeconfig import validate_kubeconfig

logger = logging.getLogger(__name__)

EDITABLE_FIELDS = ("session_domain", "ingress_node", "volume_storage_class", *ROUTING_FIELDS)
#: Fields of a new cluster in its ``cluster_register`` audit row (the kubeconfig as changed, without its value).
REGISTERED_FIELDS = ("name", "apiserver_url", "session_domain", "ingress_node", "volume_storage_class", *ROUTING_FIELDS, "kubeconfig")
#: The field of ``cluster_update`` that replaces the cluster's credential (checked, probed, same cluster only).
CREDENTIAL_FIELD = "kubeconfig"


class ClusterPrerequisiteMissing(ApplicationError):
    """422: the cluster answers but lacks something gShare needs (RuntimeClass, HAMi)."""

    status = 422
    code = CLUSTER_PREREQUISITE_MISSING


#: How many live session ids a ``cluster_has_live_sessions`` refusal names (the body's ``sessions`` has them all).
_SESSIONS_NAMED = 20


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"A registered cluster is already named {name!r}: choose another name, or deregister that cluster first "
        "(`DELETE /api/v1/clusters/<id>`).",
        code=NAME_TAKEN,
    )


def _registered() -> QuerySet[Cluster]:
    return Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED)


def _already_registered(other: Cluster, *, uid: str, server: str) -> Conflict:
    return Conflict(
        f"The kubeconfig reaches the cluster at {server} (kube-system uid {uid}), which is already registered as "
        f"{other.name!r} ({other.public_id}); a cluster is registered once, so nothing was changed. To change that "
        f"cluster's settings or credential use `PATCH /api/v1/clusters/{other.public_id}`; to register it under a new "
        f"name, deregister it first (`DELETE /api/v1/clusters/{other.public_id}`).",
        code=CLUSTER_ALREADY_REGISTERED,
        extra={"cluster": other.public_id},
    )


def _session_domain_taken(domain: str, other: Cluster) -> Conflict:
    return Conflict(
        f"Cluster {other.name!r} ({other.public_id}) already serves sessions at {domain!r}, and a session hostname "
        "routes to one cluster's ingress: choose another session_domain (its DNS name must point at this cluster's "
        f"ingress node), or first give {other.name!r} another one (`PATCH /api/v1/clusters/{other.public_id}`).",
        code=SESSION_DOMAIN_TAKEN,
        extra={"cluster": other.public_id},
    )


def _registration_conflict(*, name: str, kube_system_uid: str, server: str, session_domain: str) -> Conflict | None:
    """The refusal a new registration meets among the registered clusters (name, then identity, then
    session domain), or None."""
    if _registered().filter(name=name).exists():
        return _name_taken(name)
    if kube_system_uid:
        other = _registered().filter(kube_system_uid=kube_system_uid).first()
        if other is not None:
            return _already_registered(other, uid=kube_system_uid, server=server)
    if session_domain:
        other = _registered().filter(session_domain=session_domain).first()
        if other is not None:
            return _session_domain_taken(session_domain, other)
    return None


def cluster_live_session_ids(*, cluster: Cluster, domain: str | None = None) -> list[str]:
    """Ids (``ses_...``) of the sessions on ``cluster`` that are not in a final phase (oldest first), as the sessions
    app answers ``clusters.signals.session_domain_changing``.

    Their URL, Ingress host and connect check all use the cluster's ``session_domain``.

    Args:
        cluster: the cluster.
        domain: the ``session_domain`` the cluster would move to (passed to the receivers; default: its own).
    """
    domain = cluster.session_domain if domain is None else domain
    return [sid for ids in signals.answers(signals.session_domain_changing, cluster=cluster, domain=domain) for sid in ids]


def _session_domain_change_refusal(cluster: Cluster, domain: str) -> Conflict | None:
    """Why ``cluster`` may not move to ``session_domain`` ``domain`` now, or None.

    A running session's Ingress is on the old host while its URL and connect check would follow the new
    one, so the change waits until no session lives there (re-applying every live session is not atomic
    with the change: an apiserver may refuse half of them).
    """
    if domain == cluster.session_domain:
        return None
    if domain:
        other = _registered().filter(session_domain=domain).exclude(pk=cluster.pk).first()
        if other is not None:
            return _session_domain_taken(domain, other)
    live = cluster_live_session_ids(cluster=cluster, domain=domain)
    if not live:
        return None
    named = ", ".join(live[:_SESSIONS_NAMED]) + (f" and {len(live) - _SESSIONS_NAMED} more" if len(live) > _SESSIONS_NAMED else "")
    change = f"to {domain!r}" if domain else "to empty"
    return Conflict(
        f"Cluster {cluster.name!r} ({cluster.public_id}) has {len(live)} live session(s) ({named}) whose URL and Ingress "
        f"are on {cluster.session_domain!r}; changing session_domain {change} now would break them, so nothing was changed. "
        "Stop them (`DELETE /api/v1/sessions/<id>`) or wait until they end, then change it.",
        code=CLUSTER_HAS_LIVE_SESSIONS,
        extra={"sessions": live},
    )


def cluster_register(
    *,
    name: str,
    kubeconfig: str,
    session_domain: str = "",
    ingress_node: str = "",
    volume_storage_class: str = "",
    routing: str = contract.ROUTING_INGRESS_NGINX,
    gateway_name: str = contract.GATEWAY_NAME_DEFAULT,
    gateway_namespace: str = contract.GATEWAY_NAMESPACE_DEFAULT,
) -> Cluster:
    """Validate a kubeconfig, probe the cluster from the control plane, and record it.

    The probe runs before any row is written, bounded by ``GSHARE_PROBE_TIMEOUT`` seconds, and
    outside a transaction, so no lock is held while a slow apiserver is dialled.

    Args:
        name: unique among clusters that are not deregistered (1-63 chars).
        kubeconfig: kubeconfig text (token or client-certificate user, inline data only).
        session_domain: hostname at which this cluster's ingress serves sessions (unique among registered
            clusters, or empty).
        ingress_node: node that runs the cluster's ingress controller.
        volume_storage_class: StorageClass the operator uses for session volumes.
        routing: how sessions are reached, ``gateway-api`` or ``ingress-nginx`` (the default: a cluster registered by
            hand brings its own ingress; ``attach_cluster`` passes ``gateway-api``).
        gateway_name, gateway_namespace: the Gateway session HTTPRoutes attach to (``gateway-api``).

    Returns:
        The new ``Cluster`` (status ``pending`` until its operator's first inventory).

    Raises:
        KubeconfigError: ``kubeconfig_invalid``, ``kubeconfig_localhost``,
            ``kubeconfig_exec_forbidden``, ``kubeconfig_local_file`` (400).
        Conflict: ``name_taken`` (409); ``cluster_already_registered`` (409) when a registered cluster has the
            same ``kube-system`` uid (the same cluster under another name); ``session_domain_taken`` (409) when a
            registered cluster serves sessions at ``session_domain``. Concurrent registrations are decided by
            the partial unique indexes: one is recorded, the others get these codes.
        ClusterUnreachable: ``cluster_unreachable`` (504).
        ClusterAuthFailed: ``cluster_auth_failed`` (400), also when the credential may not read the
            ``kube-system`` namespace, whose ``metadata.uid`` is recorded as the cluster's identity
            (``Cluster.kube_system_uid``; a server without that namespace is registered without one).
        django.core.exceptions.ValidationError: a field is malformed (rendered as 400 ``invalid_request``).
        RoutingRefused: ``invalid_routing``, ``invalid_gateway_name``, ``invalid_gateway_namespace``,
            ``session_domain_is_control_plane`` (400; ``clusters.routing_mode``), before anything is dialled.
        ClusterPrerequisiteMissing: ``runtime_class_missing`` or ``hami_missing`` (422).
    """
    refusal = routing_settings_refusal({"routing": routing, "gateway_name": gateway_name, "gateway_namespace": gateway_namespace})
    refusal = refusal or session_domain_refusal(session_domain)
    if refusal is not None:
        raise refusal
    valid = validate_kubeconfig(kubeconfig, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST)
    if Cluster.objects.filter(name=name).exclude(status=Cluster.Status.DEREGISTERED).exists():
        raise _name_taken(name)

    cluster = Cluster(
        name=name,
        apiserver_url=valid.server,
        kubeconfig=valid.as_yaml(),
        session_domain=session_domain,
        ingress_node=ingress_node,
        volume_storage_class=volume_storage_class,
        routing=routing,
        gateway_name=gateway_name,
        gateway_namespace=gateway_namespace,
        status=Cluster.Status.PENDING,
    )
    cluster.full_clean(validate_constraints=False)  # before dialling anything

    result = probe_cluster(valid.config, server=valid.server, timeout=settings.GSHARE_PROBE_TIMEOUT)
    if not result.checks.get("apiserver_reachable"):
        raise ClusterUnreachable(result.details["apiserver_reachable"])
    if not result.checks.get("runtime_class_nvidia"):
        raise ClusterPrerequisiteMissing(result.details["runtime_class_nvidia"], code=RUNTIME_CLASS_MISSING)
    if not result.checks.get("hami_device_plugin"):
        raise ClusterPrerequisiteMissing(result.details["hami_device_plugin"], code=HAMI_MISSING)
    if result.identity_forbidden:
        raise ClusterAuthFailed(result.identity_forbidden)
    cluster.kubernetes_version = result.kubernetes_version
    cluster.kube_system_uid = result.kube_system_uid
    facts = {"name": name, "kube_system_uid": cluster.kube_system_uid, "server": valid.server, "session_domain": session_domain}
    conflict = _registration_conflict(**facts)
    if conflict is not None:
        raise conflict
    try:
        with transaction.atomic():
            cluster.save()
            audit_record(action=Action.CLUSTER_REGISTER, obj=cluster, changes=created({key: getattr(cluster, key) for key in REGISTERED_FIELDS}),
                         details={"kube_system_uid": cluster.kube_system_uid, "kubernetes_version": cluster.kubernetes_version})
    except IntegrityError:
        # Two registrations (same name, same cluster or same session domain) raced past the check above: a
        # partial unique index let one through and made this one wait for it, so the check now names it.
        conflict = _registration_conflict(**facts)
        if conflict is None:
            raise
        raise conflict from None
    logger.info("cluster registered: %s %s (%s)", cluster.public_id, cluster.name, cluster.kubernetes_version)
    return cluster


def _refuse_deregistered(cluster: Cluster) -> None:
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered and can no longer be changed: register it again.", code=contract.CLUSTER_DEREGISTERED)


@dataclass(frozen=True)
class _Credential:
    """A new kubeconfig that passed the checks and reached the cluster: what ``cluster_update`` stores."""

    kubeconfig: str
    apiserver_url: str
    kube_system_uid: str
    kubernetes_version: str


def cluster_update(*, cluster: Cluster, changes: dict, actor: str = "system") -> Cluster:
    """Change a cluster's editable settings and/or its kubeconfig, all or nothing.

    A new ``kubeconfig`` goes through registration's checks (``validate_kubeconfig``: same rules, same
    codes), then the probe, outside any transaction (no lock is held while an apiserver is dialled). It
    is accepted only if it reaches the same cluster: the ``kube-system`` namespace's ``metadata.uid``
    must equal ``Cluster.kube_system_uid``. For a cluster registered before that uid was recorded, it
    is first read through the current kubeconfig (and recorded); when that fails the change is refused
    with ``cluster_identity_unknown``. The cluster keeps its id, its operator tokens and its credential
    generation; ``apiserver_url`` follows the new kubeconfig. Prerequisites (RuntimeClass, HAMi) are the
    cluster's, not the credential's: they are not re-checked (the connection test reports them).

    Every change is applied in one transaction with the cluster's row locked, after every check
    passed: a refusal changes nothing. A change writes one audit row in the same transaction (``cluster_update``:
    the fields asked for, old and new, and for a new kubeconfig the apiserver it reaches; never the kubeconfig).

    Args:
        cluster: the cluster (not deregistered).
        changes: field -> new value; ``session_domain``, ``ingress_node``, ``volume_storage_class``, ``routing``,
            ``gateway_name``, ``gateway_namespace`` (strings) and ``kubeconfig`` (kubeconfig text, never logged or
            returned). A change of the routing (or, in ``gateway-api`` mode, of the Gateway) re-applies every live
            session (Scheduled, Starting, Running) of the cluster after the commit, so its routing objects follow.
        actor: who asked, for the audit line (``api:<user>``, ``console:<user>``, ...).

    Returns:
        The updated ``Cluster``; its ``sessions_reapplied`` attribute (not a field) is how many live sessions it
        re-applies (0 when the routing did not change).

    Raises:
        RoutingRefused: ``invalid_routing``, ``invalid_gateway_name``, ``invalid_gateway_namespace``,
            ``session_domain_is_control_plane`` (400), before anything is dialled.
        Conflict: ``cluster_deregistered`` (409) for a deregistered cluster; ``different_cluster`` (409)
            when the new kubeconfig reaches another cluster; ``cluster_identity_unknown`` (409) when the
            cluster has no recorded identity and its current kubeconfig cannot read it now;
            ``cluster_already_registered`` (409) when that identity, read now, is another registered
            cluster's; ``session_domain_taken`` (409) for another registered cluster's ``session_domain``;
            ``cluster_has_live_sessions`` (409, body ``sessions``: their ids) for a ``session_domain``
            change (emptying it included) while sessions not in a final phase are on the cluster.
        ApplicationError: ``invalid_request`` (400) for a field that cannot be changed.
        KubeconfigError: ``kubeconfig_invalid``, ``kubeconfig_localhost``, ``kubeconfig_exec_forbidden``,
            ``kubeconfig_local_file`` (400).
        ClusterAuthFailed: ``cluster_auth_failed`` (400): the new credential is refused, lacks a read
            permission, or may not read ``kube-system``.
        ClusterUnreachable: ``cluster_unreachable`` (504) for the new kubeconfig's apiserver.
        django.core.exceptions.ValidationError: a field is malformed (rendered as 400 ``invalid_request``).
    """
    current = Cluster.objects.get(pk=cluster.pk)
    _refuse_deregistered(current)
    unknown = set(changes) - set(EDITABLE_FIELDS) - {CREDENTIAL_FIELD}
    if unknown:
        raise ApplicationError(
            f"Only {', '.join(EDITABLE_FIELDS)} and {CREDENTIAL_FIELD} can be changed; to change {', '.join(sorted(unknown))}, "
            "deregister and register again.",
            code=INVALID_REQUEST,
        )
    fields = {key: value for key, value in changes.items() if key != CREDENTIAL_FIELD}
    refusal = routing_settings_refusal(fields)
    if refusal is None and fields.get("session_domain", current.session_domain) != current.session_domain:
        refusal = session_domain_refusal(fields["session_domain"])
    if refusal is not None:
        raise refusal
    if isinstance(fields.get("session_domain"), str):  # before dialling anything; checked again under the lock
        refusal = _session_domain_change_refusal(current, fields["session_domain"])
        if refusal is not None:
            raise refusal
    credential = None
    if CREDENTIAL_FIELD in changes:
        valid = validate_kubeconfig(changes[CREDENTIAL_FIELD], loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST)
        candidate = Cluster.objects.get(pk=cluster.pk)
        for key, value in {**fields, "kubeconfig": valid.as_yaml(), "apiserver_url": valid.server}.items():
            setattr(candidate, key, value)
        candidate.full_clean(validate_constraints=False)  # before dialling anything
        credential = _credential_check(cluster=current, valid=valid)
        fields.update(
            kubeconfig=credential.kubeconfig, apiserver_url=credential.apiserver_url, kube_system_uid=credential.kube_system_uid,
        )
        if credential.kubernetes_version:
            fields["kubernetes_version"] = credential.kubernetes_version

    try:
        with transaction.atomic():
            # Placement locks the cluster rows too (sessions.create.session_create), so under this lock no
            # session can start on the old session_domain while it changes.
            cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
            _refuse_deregistered(cluster)
            if credential is not None and cluster.kube_system_uid and cluster.kube_system_uid != credential.kube_system_uid:
                raise _different_cluster(cluster, found_uid=credential.kube_system_uid, server=credential.apiserver_url)
            if isinstance(fields.get("session_domain"), str):
                refusal = _session_domain_change_refusal(cluster, fields["session_domain"])
                if refusal is not None:
                    raise refusal
            before = {key: getattr(cluster, key) for key in (*changes, "apiserver_url")}
            routed_before = routing_key(cluster)
            for key, value in fields.items():
                setattr(cluster, key, value)
            cluster.full_clean(validate_constraints=False)
            cluster.save(update_fields=list(fields))
            # The sessions' routing objects follow the new routing: the sessions app marks each live session due for a
            # re-apply (a durable mark that sessions.reconcile relays when the publish after the commit is lost).
            reapplied = 0
            if routing_key(cluster) != routed_before:
                reapplied = sum(signals.answers(signals.cluster_routing_changed, cluster=cluster))
            if changes:  # one audit row: the fields asked for (never the kubeconfig), and for a new kubeconfig the apiserver it reaches
                details = {"apiserver_url": cluster.apiserver_url, "old_apiserver_url": before["apiserver_url"],
                           "kube_system_uid": cluster.kube_system_uid} if credential is not None else {}
                if routing_key(cluster) != routed_before:
                    details["sessions_reapplied"] = reapplied
                audit_record(
                    action=Action.CLUSTER_UPDATE, obj=cluster, actor=actor, changes={key: (before[key], getattr(cluster, key)) for key in sorted(changes)},
                    details=details,
                )
    except IntegrityError:
        # Another cluster took the domain between the check and the save (the partial unique index decided).
        domain = fields.get("session_domain") or ""
        other = _registered().filter(session_domain=domain).exclude(pk=cluster.pk).first() if domain else None
        if other is None:
            raise
        raise _session_domain_taken(domain, other) from None
    if credential is not None:
        logger.info(
            "cluster credential changed: %s %s now reaches %s (kube-system uid %s, same cluster)",
            cluster.public_id, cluster.name, cluster.apiserver_url, cluster.kube_system_uid,
        )
    cluster.sessions_reapplied = reapplied
    return cluster


def _credential_check(*, cluster: Cluster, valid) -> _Credential:
    """Probe a validated new kubeconfig and make sure it reaches ``cluster`` (outside any transaction).

    Args:
        cluster: the cluster whose credential changes.
        valid: ``kube.kubeconfig.ValidKubeconfig`` of the new kubeconfig.

    Raises:
        Conflict: ``different_cluster``, ``cluster_identity_unknown`` (409).
        ClusterAuthFailed: ``cluster_auth_failed`` (400). ClusterUnreachable: ``cluster_unreachable`` (504).
    """
    expected = cluster.kube_system_uid or _cluster_identity_record(cluster)
    result = probe_cluster(valid.config, server=valid.server, timeout=settings.GSHARE_PROBE_TIMEOUT)
    if not result.checks.get("apiserver_reachable"):
        raise ClusterUnreachable(result.details["apiserver_reachable"])
    if result.identity_forbidden:
        raise ClusterAuthFailed(result.identity_forbidden)
    if result.kube_system_uid != expected:
        raise _different_cluster(cluster, found_uid=result.kube_system_uid, server=valid.server, expected_uid=expected)
    return _Credential(
        kubeconfig=valid.as_yaml(), apiserver_url=valid.server, kube_system_uid=expected, kubernetes_version=result.kubernetes_version,
    )


def _cluster_identity_record(cluster: Cluster) -> str:
    """Read and record the identity of a cluster registered before it was recorded, through its current
    kubeconfig (the same as a connection test does).

    Returns:
        The ``kube-system`` uid, now stored in ``Cluster.kube_system_uid``.

    Raises:
        Conflict: ``cluster_identity_unknown`` (409) when the current kubeconfig cannot read it.
    """
    try:
        result = probe_cluster(yaml.safe_load(cluster.kubeconfig), server=cluster.apiserver_url, timeout=settings.GSHARE_PROBE_TIMEOUT)
    except ClusterAuthFailed as exc:
        why = exc.detail
    except ApplicationError:  # the stored kubeconfig itself cannot be used (never quoted: it holds the credential)
        why = "The stored kubeconfig cannot be used by the Kubernetes client."
    else:
        if result.kube_system_uid:
            other = _registered().filter(kube_system_uid=result.kube_system_uid).exclude(pk=cluster.pk).first()
            if other is not None:
                raise _identity_held_by(cluster, other, uid=result.kube_system_uid)
            try:
                with transaction.atomic():
                    Cluster.objects.filter(pk=cluster.pk, kube_system_uid="").update(kube_system_uid=result.kube_system_uid)
            except IntegrityError:  # another row took it meanwhile
                raise _identity_held_by(cluster, _registered().get(kube_system_uid=result.kube_system_uid), uid=result.kube_system_uid) from None
            cluster.kube_system_uid = result.kube_system_uid
            logger.info("cluster identity recorded: %s %s (kube-system uid %s)", cluster.public_id, cluster.name, result.kube_system_uid)
            return result.kube_system_uid
        why = (
            result.details.get("apiserver_reachable")
            or result.identity_forbidden
            or f"The apiserver at {cluster.apiserver_url} has no namespace kube-system."
        )
    raise Conflict(
        f"Cluster {cluster.name!r} ({cluster.public_id}) was registered before gShare recorded which cluster a kubeconfig "
        f"reaches, and its current kubeconfig cannot tell now: {why} Without that, the new kubeconfig cannot be checked to "
        "reach the same cluster, so nothing was changed. Fix: make the current kubeconfig reach the cluster again (a "
        "successful `POST /api/v1/clusters/<id>/connection-test` records the identity too) and retry, or deregister the "
        "cluster and register it again with the new kubeconfig.",
        code=CLUSTER_IDENTITY_UNKNOWN,
    )


def _identity_held_by(cluster: Cluster, other: Cluster, *, uid: str) -> Conflict:
    """A cluster registered before identities were recorded turns out to be another registered cluster."""
    return Conflict(
        f"Cluster {cluster.name!r} ({cluster.public_id}) reaches the same cluster (kube-system uid {uid}) as the registered "
        f"cluster {other.name!r} ({other.public_id}): it was registered twice, before gShare checked. Nothing was changed. "
        "Deregister the copy you do not use (`DELETE /api/v1/clusters/<id>`; keep the one whose id the cluster's operator "
        "runs with: `helm -n gshare-system get values gshare-operator` shows its clusterId), then retry on the other.",
        code=CLUSTER_ALREADY_REGISTERED,
        extra={"cluster": other.public_id},
    )


def _different_cluster(cluster: Cluster, *, found_uid: str, server: str, expected_uid: str | None = None) -> Conflict:
    expected_uid = expected_uid or cluster.kube_system_uid
    other = (
        Cluster.objects.filter(kube_system_uid=found_uid).exclude(pk=cluster.pk).exclude(status=Cluster.Status.DEREGISTERED).first()
        if found_uid else None
    )
    if not found_uid:
        found = f"the apiserver at {server}, which has no namespace kube-system"
    elif other is not None:
        found = f"the cluster at {server} (kube-system uid {found_uid}), which is the registered cluster {other.name!r} ({other.public_id})"
    else:
        found = f"another cluster: the one at {server} (kube-system uid {found_uid})"
    return Conflict(
        f"The new kubeconfig reaches {found}, not cluster {cluster.name!r} ({cluster.public_id}, kube-system uid "
        f"{expected_uid}). A cluster's kubeconfig can only be replaced by one for the same cluster; nothing was changed. "
        "To add the other cluster to the fleet, register it separately (`POST /api/v1/clusters`); to change this "
        f"cluster's credential, export a kubeconfig from {cluster.name!r} itself (`kubectl config view --raw --minify --flatten`).",
        code=DIFFERENT_CLUSTER,
    )


def cluster_live_allocations(*, cluster: Cluster) -> int:
    """How many live sessions or GPU allocations hold ``cluster``, as the apps above answer
    ``clusters.signals.cluster_deregistering`` (0 when none subscribes)."""
    return sum(signals.answers(signals.cluster_deregistering, cluster=cluster))


@transaction.atomic
def cluster_deregister(*, cluster: Cluster, actor: str = "system") -> Cluster:
    """Deregister a cluster: drop its nodes and devices, keep the row for history.

    From then on its operator tokens are refused with 401 and its name is free; its credential generation
    is bumped too (audit row ``cluster_deregister`` by ``actor``, with the status change). Idempotent.

    Args:
        cluster: the cluster.
        actor: who asked, for the audit line (``api:<user>``, ``console:<user>``, ...).

    Raises:
        Conflict: ``cluster_busy`` (409) while live sessions or GPU allocations exist on it.
    """
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        return cluster
    live = cluster_live_allocations(cluster=cluster)
    if live:
        raise Conflict(
            f"{live} live session(s) or GPU allocation(s) are on {cluster.name}: stop them "
            "(`DELETE /api/v1/sessions/<id>`) and try again.",
            code=CLUSTER_BUSY,
        )
    GpuDevice.objects.filter(cluster=cluster).delete()
    Node.objects.filter(cluster=cluster).delete()
    # Every operator token issued for it is refused from now on (token_revoked), whatever its status check says.
    credential_generation_bump(cluster=cluster, actor=actor, action="cluster_deregister", changes={"status": (cluster.status, Cluster.Status.DEREGISTERED)})
    cluster.status = Cluster.Status.DEREGISTERED
    cluster.deregistered_at = timezone.now()
    cluster.inventory_digest = ""  # its nodes and GPUs are gone: no digest-only report may stand for them
    cluster.save(update_fields=["status", "deregistered_at", "inventory_digest"])
    logger.info("cluster deregistered: %s %s", cluster.public_id, cluster.name)
    return cluster


#: Checks of the connection test that are reported but never make a cluster ``degraded``: a cluster-admin credential
#: works, it only holds more than the control plane needs (the console warns and names the fix); an operator clock off
#: the control plane's still has its reports applied (re-stamped with the control plane's time), so sessions run.
ADVISORY_CHECKS = ("credential_least_privilege", CLOCK_SYNCED)


def operator_reporting(cluster: Cluster, *, now=None) -> bool:
    """True when the cluster's operator reported within ``GSHARE_HEARTBEAT_STALE_SECONDS``."""
    now = now or timezone.now()
    stale = timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS)
    return cluster.last_heartbeat_at is not None and now - cluster.last_heartbeat_at <= stale


def cluster_connection_test(*, cluster: Cluster) -> dict:
    """Probe the cluster now and record the result and the resulting status.

    The apiserver checks are the probe's (``clusters.probe``); ``operator_reporting`` is judged now (the detail says
    since when, or never, and where to look); ``session_domain_resolves`` and ``verify_reachable`` are what the
    operator last reported from inside the cluster (``clusters.diagnosis.operator_check_verdicts``): a failure of
    either breaks every session there (the URL does not reach the ingress, or ingress-nginx cannot ask
    ``/internal/connect/verify``), so it degrades the cluster; one not reported yet (or by an operator that predates
    them) is left out of ``checks`` and explained in ``detail`` as unknown. The operator's state is read after the
    probe, under the cluster's row lock (the inventory writes it under the same lock), so a report that came during
    the probe is the one judged.

    Returns:
        ``{"status": "connected"|"degraded"|"unreachable", "checks": {name: bool},
        "detail": {name: sentence}, "kubernetes_version": str, "tested_at": ISO 8601 UTC, "routing": {"mode",
        "controller", "gateway_programmed", "detail"}}`` (``clusters.routing_mode.routing_probe``: reported, and a problem
        when the controller or Gateway is missing, never a change of status).
        ``connected`` when every check in ``checks`` passes (``credential_least_privilege``, present when the apiserver
        answered a SelfSubjectAccessReview, is advisory: ``ADVISORY_CHECKS``), ``unreachable`` when the apiserver did
        not answer, ``degraded`` otherwise. ``detail`` has a sentence naming the fix for each failed check, and one for
        each unknown operator check.

    Raises:
        Conflict: ``cluster_deregistered`` (409).
    """
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered: register it again to test it.", code=contract.CLUSTER_DEREGISTERED)
    result = probe_cluster(yaml.safe_load(cluster.kubeconfig), server=cluster.apiserver_url, timeout=settings.GSHARE_PROBE_TIMEOUT)
    checks = {name: result.checks.get(name, False) for name in ("apiserver_reachable", "runtime_class_nvidia", "hami_device_plugin", "gpu_nodes")}
    details = dict(result.details)
    if not checks["apiserver_reachable"]:
        for name in ("runtime_class_nvidia", "hami_device_plugin", "gpu_nodes"):
            details.setdefault(name, "Not checked: the apiserver did not answer.")
    if "credential_least_privilege" in result.checks:
        checks["credential_least_privilege"] = result.checks["credential_least_privilege"]
    routing = routing_probe(cluster, timeout=settings.GSHARE_PROBE_TIMEOUT, reachable=checks["apiserver_reachable"])
    with transaction.atomic():
        # What the operator reported meanwhile counts (the probe took seconds): its checks and heartbeat are read under
        # the row lock the inventory writes them under, after the probe (no lock is held over an apiserver call).
        current = Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        if current is not None:
            for field_name in ("operator_checks", "last_heartbeat_at", "session_domain", "ingress_node", "status",
                               "clock_offset_seconds", "clock_offset_at"):
                setattr(cluster, field_name, getattr(current, field_name))
        report, update = _connection_test_outcome(cluster, result, checks, details)
        report["routing"] = routing
        if current is not None and current.status != Cluster.Status.DEREGISTERED:
            try:
                with transaction.atomic():
                    Cluster.objects.filter(pk=cluster.pk).update(**update)
            except IntegrityError:  # another row took that identity meanwhile: record the rest
                if "kube_system_uid" not in update:
                    raise
                update.pop("kube_system_uid")
                Cluster.objects.filter(pk=cluster.pk).update(**update)
    for key, value in update.items():
        setattr(cluster, key, value)
    return report


def _connection_test_outcome(cluster: Cluster, result, checks: dict, details: dict) -> tuple[dict, dict]:
    """The connection test's report and the cluster fields to write, from the probe's ``checks`` and ``details`` and
    the cluster's operator state as read now (``operator_reporting``, the operator's session-path checks)."""
    checks["operator_reporting"] = operator_reporting(cluster)
    if not checks["operator_reporting"]:
        details["operator_reporting"] = operator_reporting_detail(cluster)
    # The session path as the operator saw it from inside the cluster. A check it has not reported is unknown: left
    # out of ``checks`` (so it neither passes nor degrades), said so in ``detail``.
    for verdict in operator_check_verdicts(cluster):
        if verdict.ok is not None:
            checks[verdict.name] = verdict.ok
        if verdict.ok is not True:
            details[verdict.name] = verdict.detail
    # The operator's clock, by the offset it last reported: advisory (reports still flow, re-stamped), unknown left out.
    clock = clock_verdict(cluster)
    if clock.ok is not None:
        checks[clock.name] = clock.ok
    details[clock.name] = clock.detail
    if not checks["apiserver_reachable"]:
        status = Cluster.Status.UNREACHABLE
    elif all(ok for name, ok in checks.items() if name not in ADVISORY_CHECKS):
        status = Cluster.Status.CONNECTED
    else:
        status = Cluster.Status.DEGRADED
    now = timezone.now()
    report = {
        "status": str(status),
        "checks": checks,
        "detail": details,
        "kubernetes_version": result.kubernetes_version,
        "tested_at": now.isoformat(),
    }
    update = {"status": status, "last_connection_test": report, "last_connection_test_at": now}
    if result.kubernetes_version:
        update["kubernetes_version"] = result.kubernetes_version
    if result.kube_system_uid and not cluster.kube_system_uid:
        # A cluster registered before identities were recorded; not when that identity is another registered
        # cluster's (the same cluster registered twice): PATCH with a kubeconfig says so.
        held = _registered().filter(kube_system_uid=result.kube_system_uid).exclude(pk=cluster.pk).exists()
        if not held:
            update["kube_system_uid"] = result.kube_system_uid
    return report, update


@dataclass(frozen=True)
class InventoryResult:
    """Counts after an inventory snapshot was applied: nodes and GPUs in the snapshot, those removed, and
    those kept although missing from it (``missing_since``) because live sessions hold them."""

    nodes: int | None
    gpus: int | None
    nodes_removed: int
    gpus_removed: int
    nodes_missing: int = 0
    gpus_missing: int = 0
    #: The digest recorded for the cluster ("" when none: the next report must be a full snapshot).
    digest: str = ""
    #: True for a digest-only report (``inventory_confirm``): nothing was read, ``nodes`` and ``gpus`` are None.
    unchanged: bool = False


#: C0 and C1 control characters: a detail is shown on the cluster page, in API answers and by the attach command on a
#: terminal, where an escape sequence from the cluster must not act.
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _known_checks(checks: dict | None) -> dict:
    """The operator's checks this control plane knows (``OPERATOR_CHECKS``), as reported (control characters in a
    ``detail`` replaced by spaces); others are ignored."""
    if not isinstance(checks, dict):
        return {}
    known = {}
    for name in OPERATOR_CHECKS:
        result = checks.get(name)
        if isinstance(result, dict):
            detail = result.get("detail")
            known[name] = {**result, "detail": _CONTROL_CHARACTERS.sub(" ", detail)} if isinstance(detail, str) else result
    return known


class InventorySnapshotRequired(Conflict):
    """409 ``inventory_snapshot_required``: a digest-only report names a snapshot other than the one last applied."""

    code = INVENTORY_SNAPSHOT_REQUIRED


@transaction.atomic
def inventory_apply(*, cluster: Cluster, nodes: list[dict], checks: dict | None = None, digest: str = "",
                    clock_offset: float | None = None) -> InventoryResult:
    """Replace a cluster's nodes and GPU devices with a full snapshot from its operator.

    The snapshot is COPYed into staging tables and moved in by set-based statements that write only the rows whose
    reported values changed (``clusters.inventory``), in one transaction and a constant number of queries, whatever
    the number of nodes (asserted in the tests). Only this cluster's row is locked: snapshots of different clusters
    run in parallel. A GPU UUID is one cluster's (the unique index on ``GpuDevice.uuid``): the upsert never takes
    another cluster's row, also when two clusters race to claim a new UUID (the first to commit has it).

    What is gone is deleted, except a GPU a live session (not Terminated or Failed) holds, by a
    reservation or as HAMi's allocation reported by the operator: deleting it would drop the
    reservation (the GPU would come back free and be placed twice) and refuse its usage samples. It
    is kept with ``missing_since`` set and ``health`` false (placement skips it), and its node, if the
    node is gone too, is kept not ready with ``missing_since`` set. A later snapshot that lists them
    again matches them by UUID and name (reservations and counters intact, ``missing_since`` cleared);
    one that still leaves them out after their sessions ended deletes them.

    Args:
        cluster: the cluster named in the operator token.
        nodes: validated snapshot nodes: ``{"name", "labels", "ready", "devices": [{"uuid", "index",
            "model", "memory_mib", "split_count", "cores", "health", "mode"?}]}``.
        checks: the snapshot's validated ``checks`` (name -> ``{"ok", "detail", "checked_at"}``), recorded as
            ``Cluster.operator_checks`` (names this control plane does not know are dropped); None or absent (an
            operator that predates them) records none, so the connection test shows them as unknown.
        digest: the operator's ``contract.inventory_digest`` of ``nodes`` ("" when it sent none). Recorded as
            ``Cluster.inventory_digest`` (what a later digest-only report is checked against, ``inventory_confirm``),
            unless the snapshot left GPUs or nodes kept missing: their removal waits for the sessions that hold them,
            which only a full snapshot decides, so then "" is recorded and the next report must be full.
        clock_offset: the snapshot's ``clock_offset_seconds`` (seconds to add to the operator's clock to get the
            control plane's), recorded as ``Cluster.clock_offset_seconds`` with the time it arrived; None (an operator
            that predates it, or one that has had no answer yet) records none, so ``clock_synced`` is unknown.

    Returns:
        An ``InventoryResult``: ``nodes_removed`` / ``gpus_removed`` count deleted nodes and GPUs
        (never the reservations deleted with them); ``nodes_missing`` / ``gpus_missing`` those kept; ``digest`` the one
        recorded.

    Raises:
        Forbidden: ``forbidden_cluster_scope`` (403) when a GPU UUID in the snapshot belongs to
            another cluster (a kept, missing GPU still belongs to its cluster); nothing is changed.
        Conflict: ``cluster_deregistered`` (409) if the cluster was deregistered meanwhile.
    """
    # The cluster's row lock also keeps its sessions' reservations from changing meanwhile (placement and the
    # release paths take it first), so which missing GPUs are held cannot change under this transaction.
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered; its inventory is no longer accepted.", code=contract.CLUSTER_DEREGISTERED)
    now = timezone.now()
    with connection.cursor() as cursor:
        # Nodes first, then GPUs, removals last: a GPU that moved off a node that is gone is on its new node by then,
        # so deleting the old node cannot take it (and its reservations) along.
        gpus = inventory.stage(cursor, nodes)
        inventory.node_upsert(cursor, cluster_id=cluster.pk, cluster_name=cluster.name, now=now)
        foreign = inventory.device_upsert(cursor, cluster_id=cluster.pk, now=now)
        if foreign:
            raise Forbidden(
                f"GPU(s) {', '.join(foreign)} belong to another cluster; an operator may only report its own cluster's "
                "GPUs. Check that this operator runs with its own cluster's token.",
                code=FORBIDDEN_CLUSTER_SCOPE,
            )
        nodes_removed, gpus_removed, nodes_missing, gpus_missing = inventory.missing_apply(
            cursor, cluster_id=cluster.pk, now=now, seen=cluster.last_heartbeat_at)
        recorded = "" if nodes_missing or gpus_missing else digest
        # One statement for three things, so the query count stays what it was: the heartbeat, the digest, and
        # placement's per-node summary (clusters.models.NODE_SUMMARY) recomputed from the device counters for every
        # node of the cluster. GPUs may have gone (with the reservations of ended sessions), gone missing (health
        # false), moved to another node, changed health, or come new; rows already right are not written. The
        # cluster's row lock, held since the start, keeps reservations from changing meanwhile.
        summary = node_summary_update_sql(devices="clusters_gpudevice", nodes_where="n2.cluster_id = %(cluster)s")
        cursor.execute(f"WITH nodes AS ({summary} RETURNING n.id) {_HEARTBEAT_SQL}",
                       _heartbeat_params(cluster, checks, now=now, digest=recorded, clock_offset=clock_offset))
    signals.answers(signals.capacity_changed, cluster=cluster)
    return InventoryResult(
        nodes=len(nodes), gpus=gpus, nodes_removed=nodes_removed, gpus_removed=gpus_removed,
        nodes_missing=nodes_missing, gpus_missing=gpus_missing, digest=recorded,
    )


#: The report's effect on the cluster row: heartbeat, status, the operator's checks and the recorded digest.
_HEARTBEAT_SQL = """
    UPDATE clusters_cluster SET last_heartbeat_at = %(now)s, status = COALESCE(%(status)s, status),
           operator_checks = %(checks)s::jsonb, inventory_digest = %(digest)s,
           clock_offset_seconds = %(offset)s, clock_offset_at = %(offset_at)s
     WHERE id = %(cluster)s"""


def _heartbeat_params(cluster: Cluster, checks: dict | None, *, now, digest: str, clock_offset: float | None) -> dict:
    reported_status = _reported_status(cluster, checks)
    return {"cluster": cluster.pk, "now": now, "status": str(reported_status) if reported_status else None,
            "checks": json.dumps(_known_checks(checks)), "digest": digest,
            "offset": clock_offset, "offset_at": now if clock_offset is not None else None}


@transaction.atomic
def inventory_confirm(*, cluster: Cluster, digest: str, checks: dict | None = None,
                      clock_offset: float | None = None) -> InventoryResult:
    """Record a digest-only report: the operator's snapshot is still the one last applied, with digest ``digest``.

    Nothing of the nodes and GPUs is read or written: they are what that snapshot made them (``inventory_apply``
    records a digest only when it left nothing for a later snapshot to decide). The report counts as a heartbeat and
    records its ``checks`` exactly as a full snapshot does.

    Args:
        cluster: the cluster named in the operator token.
        digest: ``contract.inventory_digest`` of the operator's current snapshot.
        checks, clock_offset: as for ``inventory_apply``.

    Returns:
        An ``InventoryResult`` with ``unchanged`` true (no counts: nothing was read).

    Raises:
        InventorySnapshotRequired: ``inventory_snapshot_required`` (409) when the recorded digest is another (or none):
            the operator sends its full snapshot instead. Nothing is changed.
        Conflict: ``cluster_deregistered`` (409).
    """
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered; its inventory is no longer accepted.", code=contract.CLUSTER_DEREGISTERED)
    if not digest or cluster.inventory_digest != digest:
        raise InventorySnapshotRequired(
            f"The control plane's inventory of this cluster is not the snapshot with digest {digest[:80]!r} "
            f"({'it has none recorded' if not cluster.inventory_digest else 'another snapshot was applied last'}): "
            "send the full snapshot (`PUT /internal/v1/inventory` with `nodes`)."
        )
    with connection.cursor() as cursor:
        cursor.execute(_HEARTBEAT_SQL, _heartbeat_params(cluster, checks, now=timezone.now(), digest=digest,
                                                         clock_offset=clock_offset))
    return InventoryResult(nodes=None, gpus=None, nodes_removed=0, gpus_removed=0, digest=digest, unchanged=True)


def _reported_status(cluster: Cluster, reported: dict | None = None) -> Cluster.Status | None:
    """The status a report gives the cluster, or None to keep its own.

    A report makes a ``pending`` or ``unreachable`` cluster ``connected``, and a ``degraded`` one too unless its last
    connection test found another problem. The operator's own checks are judged by this report (``reported``), not by
    the last test: a DNS record fixed since then counts as fixed, and a report that says one fails never makes the
    cluster ``connected`` (a ``pending`` or ``unreachable`` one becomes ``degraded``: its operator reports, its session
    path is broken).
    """
    reported_ok = all(result.get("ok") for result in _known_checks(reported).values())
    if cluster.status in (Cluster.Status.PENDING, Cluster.Status.UNREACHABLE):
        return Cluster.Status.CONNECTED if reported_ok else Cluster.Status.DEGRADED
    if cluster.status != Cluster.Status.DEGRADED:
        return None
    checks = (cluster.last_connection_test or {}).get("checks", {})
    tested = all(ok for name, ok in checks.items()
                 if name != "operator_reporting" and name not in OPERATOR_CHECKS and name not in ADVISORY_CHECKS)
    return Cluster.Status.CONNECTED if tested and reported_ok else None


def clusters_mark_stale(*, now=None) -> int:
    """Mark connected clusters whose operator stopped reporting as ``degraded``.

    Idempotent: a second run with nothing new changes nothing.

    Returns:
        How many clusters changed status.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS)
    return Cluster.objects.filter(status=Cluster.Status.CONNECTED, last_heartbeat_at__lt=cutoff).update(
        status=Cluster.Status.DEGRADED
    )
