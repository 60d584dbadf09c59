"""Step 10 of ``attach_cluster``: the control plane's connection test passes and the operator's first inventory (sent
after this attach began) arrives."""

from __future__ import annotations

import time

from django.conf import settings

from attach import releases
from attach.api_client import ControlPlaneError
from attach.context import StepContext
from contract import CLOCK_SYNCED, OPERATOR_CHECKS, rfc3339

TITLE = "connection test and first inventory"
#: Connection-test checks that never stop the attach: the operator is only being deployed, and a cluster-admin
#: credential works (advisory; the attach registers a least-privilege one anyway), and an operator clock off the control
#: plane's is advisory too (the cluster page and the connection test keep naming its fix).
SOFT_CHECKS = frozenset({"operator_reporting", "credential_least_privilege", CLOCK_SYNCED})


def run(ctx: StepContext) -> str:
    """Run the connection test, wait (``GSHARE_ATTACH_INVENTORY_TIMEOUT`` seconds) for the first inventory, run it again;
    sets ``state.cluster`` to the cluster as the API shows it then.

    Raises:
        AttachStopped: a check failed (its sentence names the fix), or no inventory came in time.
    """
    cluster = ctx.state.cluster
    assert cluster is not None
    with ctx.control_plane() as api:
        # Before the new operator reports, its session-path checks may be from an earlier run: not judged yet.
        _refuse_failed(ctx, api.connection_test(cluster["id"]), ignore=SOFT_CHECKS | set(OPERATOR_CHECKS))
        deadline = time.monotonic() + settings.GSHARE_ATTACH_INVENTORY_TIMEOUT
        while True:
            current = api.cluster(cluster["id"])
            heartbeat = rfc3339.parse(current.get("last_heartbeat_at"))
            if heartbeat is not None and heartbeat >= ctx.state.started_at:
                break
            if time.monotonic() > deadline:
                raise ctx.stop(f"the operator has sent no inventory within {settings.GSHARE_ATTACH_INVENTORY_TIMEOUT:.0f} s",
                               f"see why: kubectl -n {releases.operator_namespace()} logs deploy/gshare-operator "
                               f"(it must reach {ctx.options.control_plane_url})")
            time.sleep(0.5)
        result = api.connection_test(cluster["id"])
        # Now the operator's own checks from inside the cluster (session domain, verify) count, once it sent them.
        _refuse_failed(ctx, result, ignore=SOFT_CHECKS)
        ctx.state.cluster = api.cluster(cluster["id"])
    return f"ok: {result.get('status')}; first inventory in ({ctx.state.cluster.get('node_count', 0)} GPU node(s))"


def _refuse_failed(ctx: StepContext, result: dict, *, ignore: frozenset[str] | set[str]) -> None:
    """Stop on the first failed check of a connection test outside ``ignore``; its sentence names the fix."""
    checks, details = result.get("checks"), result.get("detail") or {}
    if not isinstance(checks, dict) or not isinstance(details, dict):
        raise ControlPlaneError("the connection test answered without its checks, not gShare's API")
    for name, ok in checks.items():
        if not ok and name not in ignore:
            detail = str(details.get(name, ""))
            raise ctx.stop(f"connection test: {name} failed: {detail}", detail)
