"""What is wrong with a cluster and how to fix it, in the words the connection test, ``GET /api/v1/clusters/{id}`` and
the console's cluster page all use (docs/attach.md, "When it does not work"). No query, no write.

* ``operator_reporting_detail``: the operator has not reported since a time, or never, and where to look (its log, the
  control plane chart's internal plane and its source range, a refused token).
* ``operator_check_verdicts``: the session-path checks the operator reported from inside its cluster
  (``Cluster.operator_checks``, ``operator_agent.session_path``), each passed, failed with its fix, or unknown (not
  reported yet, or by an operator that predates them: unknown is not a failure).
* ``clock_verdict``: the operator's clock against the control plane's (``clock_synced``), from the offset it reports with
  its inventory: in sync, off by more than ``GSHARE_CLOCK_SKEW_TOLERANCE`` with the fix (NTP on its node), or unknown.
* ``cluster_problems``: every problem at once (the token's warning, reporting, the session path, the last connection
  test's other failed checks), for the API and the console.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster
from clusters.operator_refusals import REFUSAL_MEANINGS
from clusters.operator_token.rotation import operator_token_state
from clusters.routing_mode import ATTACH_COMMAND
from contract import (
    CLOCK_SYNCED,
    CONNECT_EXT_AUTHZ_PATH,
    CONNECT_VERIFY_PATH,
    OPERATOR_CHECKS,
    ROUTING_GATEWAY_API,
    SESSION_DOMAIN_RESOLVES,
)

#: Where the operator's log is (charts/gshare-operator: Deployment ``gshare-operator`` in ``gshare-system``).
OPERATOR_LOGS_COMMAND = "kubectl -n gshare-system logs deploy/gshare-operator"
#: The control plane chart's values that let a cluster's operator and ingress reach ``/internal`` (charts/gshare).
INTERNAL_PLANE_VALUES = (
    "the control plane chart's `ingress.internalPlane.enabled=true`, with this cluster's egress address in "
    "`ingress.internalPlane.sourceRange`"
)


def _when(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rotate(cluster: Cluster) -> str:
    return f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`"


def connect_verify_url() -> str:
    """The ``auth-url`` the control plane puts on every session Ingress (``GSHARE_CONTROL_PLANE_URL`` + verify path)."""
    return settings.GSHARE_CONTROL_PLANE_URL.rstrip("/") + CONNECT_VERIFY_PATH


def connect_ext_authz_url() -> str:
    """The ext_authz URL prefix session SecurityPolicies send Envoy's checks to (``GSHARE_CONTROL_PLANE_URL`` +
    ``CONNECT_EXT_AUTHZ_PATH``; a GShareSession's ``spec.extAuthUrl``)."""
    return settings.GSHARE_CONTROL_PLANE_URL.rstrip("/") + CONNECT_EXT_AUTHZ_PATH


def operator_reporting_detail(cluster: Cluster, *, now: datetime.datetime | None = None) -> str:
    """The sentence of a failed ``operator_reporting``: since when (or never), what was refused, where to look.

    Args:
        cluster: the cluster as loaded (heartbeat and recorded refusals are read from it).
        now: the time to judge against (default: now).
    """
    now = now or timezone.now()
    if cluster.last_heartbeat_at is None:
        since = "The operator has never reported."
    else:
        seconds = int((now - cluster.last_heartbeat_at).total_seconds())
        since = (
            f"The operator has not reported since {_when(cluster.last_heartbeat_at)} ({seconds} s ago; reports are "
            f"expected within {settings.GSHARE_HEARTBEAT_STALE_SECONDS} s)."
        )
    refused = ""
    if cluster.operator_refused_since is not None:
        reason = cluster.operator_refused_reason or "refused"
        meaning = REFUSAL_MEANINGS.get(reason, "its token is refused")
        refused = (
            f" Its callbacks are refused since {_when(cluster.operator_refused_since)} ({reason}: {meaning}): "
            f"rotate its token with {_rotate(cluster)}."
        )
    return (
        f"{since}{refused} Its log says what failed when it called the control plane (DNS, TLS, a refused connection, "
        f"a 403 from the ingress source range, an HTML page from the public console, a 401): `{OPERATOR_LOGS_COMMAND}`. "
        f"It reaches the control plane only through {INTERNAL_PLANE_VALUES}, at the host of its `controlPlaneUrl`; a 401 "
        f"there is fixed by {_rotate(cluster)}."
    )


def _fix(cluster: Cluster, name: str) -> str:
    if name == SESSION_DOMAIN_RESOLVES:
        return (
            f"Then record the name that does: `PATCH /api/v1/clusters/{cluster.public_id}` with "
            '`{"session_domain": "<a name whose DNS record points at the ingress node>"}` (or `{"ingress_node": '
            '"<the node that runs the ingress controller>"}`), while no session runs there.'
        )
    return session_auth_fix(cluster)


def session_auth_fix(cluster: Cluster) -> str:
    """Where the cluster's session routes ask whether a request may pass, and what must reach it (the "connect returns
    401" fix), in the cluster's routing mode: ingress-nginx's ``auth-url``, or the Gateway's Envoy Gateway
    ``SecurityPolicy`` ``extAuth`` (``GSHARE_CONTROL_PLANE_URL`` + ``CONNECT_EXT_AUTHZ_PATH``)."""
    if cluster.routing == ROUTING_GATEWAY_API:
        return (
            f"Session HTTPRoutes on the Gateway {cluster.gateway_namespace}/{cluster.gateway_name} are guarded by Envoy "
            f"Gateway's SecurityPolicy extAuth, which sends every request to {connect_ext_authz_url()} (the control plane's "
            f"`controlPlaneUrl` + {CONNECT_EXT_AUTHZ_PATH}) before letting it through: that host must be reachable from "
            f"the Gateway's Envoy proxies, through {INTERNAL_PLANE_VALUES}. Envoy Gateway and that Gateway are installed "
            f"by {ATTACH_COMMAND.format(mode=ROUTING_GATEWAY_API)}; the connection test's `routing` says whether its "
            "GatewayClass is Accepted and the Gateway Programmed."
        )
    return (
        f"Session Ingresses send every request to {connect_verify_url()} (the control plane's `controlPlaneUrl` + "
        f"{CONNECT_VERIFY_PATH}, ingress-nginx's auth-url) before letting it through: that host must be reachable from "
        f"the cluster's ingress controller, through {INTERNAL_PLANE_VALUES}."
    )


@dataclass(frozen=True)
class CheckVerdict:
    """One operator check: ``ok`` True/False as reported, or None when unknown; ``detail`` the sentence to show
    (the fix when it failed, why it is unknown)."""

    name: str
    ok: bool | None
    detail: str


def operator_check_verdicts(cluster: Cluster) -> list[CheckVerdict]:
    """The session-path checks of ``cluster`` as its operator last reported them (``OPERATOR_CHECKS`` order).

    A check is unknown (``ok`` None) when the operator has not reported it: before its second inventory, when the
    cluster has no ``session_domain``, or when the operator predates the checks (then it never will: upgrade
    charts/gshare-operator).
    """
    reported = cluster.operator_checks if isinstance(cluster.operator_checks, dict) else {}
    verdicts = []
    for name in OPERATOR_CHECKS:
        result = reported.get(name)
        if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
            if name == SESSION_DOMAIN_RESOLVES and not cluster.session_domain:
                why = (
                    "Unknown: the cluster has no session_domain, so sessions get no URL: set one with "
                    f'`PATCH /api/v1/clusters/{cluster.public_id}` with `{{"session_domain": "<hostname>"}}`.'
                )
            else:
                why = (
                    "Unknown, not failed: the operator has not reported this check yet. It checks it from inside the "
                    "cluster and reports it with its next inventory; an operator older than this control plane never "
                    "does (upgrade charts/gshare-operator)."
                )
            verdicts.append(CheckVerdict(name, None, why))
            continue
        checked = f" (checked by the operator at {result.get('checked_at') or '?'})"
        detail = str(result.get("detail") or "")
        if result["ok"]:
            verdicts.append(CheckVerdict(name, True, detail + checked))
        else:
            verdicts.append(CheckVerdict(name, False, f"{detail}{checked}. {_fix(cluster, name)}"))
    return verdicts


def clock_verdict(cluster: Cluster) -> CheckVerdict:
    """``clock_synced``: whether the operator's clock is within ``GSHARE_CLOCK_SKEW_TOLERANCE`` seconds of the control
    plane's, by the ``clock_offset_seconds`` of its latest inventory (``Cluster.clock_offset_seconds``).

    Returns:
        ``ok`` True with the offset; False with the offset, what it breaks and the fix (NTP on the operator's node);
        None when no offset was reported (before the operator's first answer, or an operator that predates it).
    """
    offset, tolerance = cluster.clock_offset_seconds, settings.GSHARE_CLOCK_SKEW_TOLERANCE
    if offset is None:
        return CheckVerdict(CLOCK_SYNCED, None, (
            "Unknown, not failed: the operator has not reported its clock offset. It reports it with its next inventory; "
            "an operator older than this control plane never does (upgrade charts/gshare-operator)."
        ))
    when = f" (reported {_when(cluster.clock_offset_at)})" if cluster.clock_offset_at else ""
    if abs(offset) <= tolerance:
        return CheckVerdict(CLOCK_SYNCED, True, f"The operator's clock is {_offset(offset)}{when}, within {tolerance:g} s.")
    return CheckVerdict(CLOCK_SYNCED, False, (
        f"The operator's clock is {_offset(offset)}{when}, beyond the {tolerance:g} s tolerance: its status reports "
        "from ahead are refused (report_from_future) and sent again with the control plane's time, and its usage "
        "windows are stamped with the wrong time. Enable NTP on the node that runs the operator (chrony or "
        "systemd-timesyncd: `timedatectl set-ntp true`, then `timedatectl timesync-status` or `chronyc tracking`); "
        f"find the node with `kubectl -n gshare-system get pods -o wide` (`{OPERATOR_LOGS_COMMAND}` shows the offset)."
    ))


def _offset(offset: float) -> str:
    """``offset`` (control plane minus operator, seconds) in words: how far the operator's clock is ahead or behind."""
    if offset == 0:
        return "in step with the control plane's"
    return f"{abs(offset):.3f} s {'behind' if offset > 0 else 'ahead of'} the control plane's"


@dataclass(frozen=True)
class Problem:
    """A problem of a cluster: ``check`` (a connection-test check name, or ``operator_token``) and its sentence."""

    check: str
    detail: str


def cluster_problems(cluster: Cluster, *, now: datetime.datetime | None = None) -> list[Problem]:
    """Every problem of ``cluster`` now, each with its fix; empty when nothing is known to be wrong. No query.

    In order: the operator token's warning (refused callbacks first), the operator not reporting (judged now), the
    failed session-path checks (as last reported), its clock off (``clock_verdict``), the other checks the last connection test failed, and (``routing``)
    its routing controller not found or Gateway not programmed, when that test was of the cluster's current mode.
    """
    if cluster.status == Cluster.Status.DEREGISTERED:
        return []
    now = now or timezone.now()
    problems = []
    warning = operator_token_state(cluster, now=now).warning
    if warning:
        problems.append(Problem("operator_token", warning))
    stale = datetime.timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS)
    if cluster.last_heartbeat_at is None or now - cluster.last_heartbeat_at > stale:
        problems.append(Problem("operator_reporting", operator_reporting_detail(cluster, now=now)))
    problems.extend(Problem(v.name, v.detail) for v in operator_check_verdicts(cluster) if v.ok is False)
    clock = clock_verdict(cluster)
    if clock.ok is False:
        problems.append(Problem(clock.name, clock.detail))
    test = cluster.last_connection_test if isinstance(cluster.last_connection_test, dict) else {}
    details = test.get("detail") or {}
    for name, ok in (test.get("checks") or {}).items():
        if ok is False and name not in ("operator_reporting", CLOCK_SYNCED, *OPERATOR_CHECKS):
            problems.append(Problem(name, str(details.get(name) or "")))
    routing = test.get("routing")
    if isinstance(routing, dict) and routing.get("mode") == cluster.routing and (
        routing.get("controller") is False or routing.get("gateway_programmed") is False
    ):
        problems.append(Problem("routing", f"{routing.get('detail') or ''} {session_auth_fix(cluster)}".strip()))
    return problems


__all__ = [
    "CheckVerdict", "Problem", "clock_verdict", "cluster_problems", "connect_ext_authz_url", "connect_verify_url", "operator_check_verdicts",
    "operator_reporting_detail", "session_auth_fix",
]
