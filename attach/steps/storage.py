"""Step 9 of ``attach_cluster`` (with ``--storage-values``): every node has an NFS client and reaches the NFS server
(a check pod per node), then democratic-csi is installed (``releases.storage_plan``; the same release
``python -m attach.bootstrap_storage`` installs without the control plane)."""

from __future__ import annotations

from attach.context import StepContext, name_of

TITLE = "storage"


def run(ctx: StepContext) -> str:
    """Check NFS from every node, then install democratic-csi; "skipped" without ``--storage-values``.

    Raises:
        AttachStopped: a node lacks ``mount.nfs`` or cannot reach the server's ports, or Helm failed.
    """
    plan = ctx.state.storage
    if plan is None:
        return "skipped (no --storage-values)"
    targets = [f"{plan.server}:{port}" for port in plan.ports]
    names = [name_of(n) for n in ctx.state.nodes]
    reports = ctx.run_checks("nfs", names, targets)
    problems, fixes = [], []
    for node in names:
        report = reports[node]
        if report.status("mount.nfs") != "ok":
            problems.append(f"{node}: no NFS client (mount.nfs missing)")
            fixes.append(f"on {node}: sudo apt-get install -y nfs-common (Debian/Ubuntu) or sudo dnf install -y nfs-utils (RHEL)")
        unreachable = [t for t in targets if report.status(f"tcp {t}") != "ok"]
        if unreachable:
            problems.append(f"{node}: cannot reach {', '.join(unreachable)}")
            fixes.append(f"open TCP {', '.join(str(p) for p in plan.ports)} on {plan.server} to {node} (firewall) and add "
                         f"{node}'s subnet to the export's allowed networks")
    if problems:
        raise ctx.stop("; ".join(problems), "\n".join(fixes))
    done = ctx.install(plan.release)
    return (f"ok: NFSv{plan.nfs_version} server reachable from {len(names)} node(s); {done}; "
            f"operator volume StorageClass {plan.storage_class}")
