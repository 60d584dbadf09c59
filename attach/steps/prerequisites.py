"""Step 2 of ``attach_cluster``: every GPU node has the NVIDIA driver, the container toolkit and containerd's ``nvidia``
runtime, as a check pod on each node reports (``attach.checks``)."""

from __future__ import annotations

from attach import checks, releases
from attach.context import StepContext, name_of

TITLE = "GPU node prerequisites"


def run(ctx: StepContext) -> str:
    """Check every node; sets ``state.gpu_nodes`` (node -> GPUs on its PCI bus).

    Raises:
        AttachStopped: a GPU node lacks a prerequisite (the fix installs it on that node), or no node has a GPU.
    """
    names = [name_of(n) for n in ctx.state.nodes]
    reports = ctx.run_checks("node", names)
    problems: list[str] = []
    fixes: list[str] = []
    for node in names:
        report = reports[node]
        if not report.complete:
            problems.append(f"{node}: the check was cut short")
            fixes.append(f"kubectl -n {releases.operator_namespace()} logs {checks.check_pod_name('node', node)}  # on a re-run")
            continue
        gpus = checks.gpu_count(report)
        if not gpus:
            continue
        ctx.state.gpu_nodes[node] = gpus
        smi = report.items.get("nvidia-smi")
        if smi is None or smi.status != "ok":
            said = f": {smi.output[0]}" if smi and smi.output else ""
            problems.append(f"{node}: the NVIDIA driver is {'not working' if smi and smi.status == 'failed' else 'not installed'}"
                            f" (nvidia-smi {smi.status if smi else 'missing'}{said})")
            fixes.append(f"on {node}: install the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install --gpgpu; "
                         "RHEL: sudo dnf module install nvidia-driver:latest-dkms), then reboot the node")
        if report.status("nvidia-ctk") != "ok":
            problems.append(f"{node}: the NVIDIA Container Toolkit is not installed (nvidia-ctk missing)")
            fixes.append(f"on {node}: install nvidia-container-toolkit (https://docs.nvidia.com/datacenter/cloud-native/"
                         "container-toolkit/latest/install-guide.html), then: sudo nvidia-ctk runtime configure "
                         "--runtime=containerd && sudo systemctl restart containerd")
        elif report.status("containerd-nvidia-runtime") != "ok":
            problems.append(f"{node}: containerd has no nvidia runtime registered")
            fixes.append(f"on {node}: sudo nvidia-ctk runtime configure --runtime=containerd && sudo systemctl restart containerd")
    if problems:
        raise ctx.stop("; ".join(problems), "\n".join(fixes))
    if not ctx.state.gpu_nodes:
        raise ctx.stop("no node of this cluster has an NVIDIA GPU (no 0x10de display controller on any PCI bus)",
                       "check the kubeconfig names the GPU cluster: kubectl get nodes -o wide")
    listed = ", ".join(f"{node} ({count} GPU{'s' if count > 1 else ''})" for node, count in sorted(ctx.state.gpu_nodes.items()))
    return f"ok: {listed}; driver, toolkit and containerd runtime present"
