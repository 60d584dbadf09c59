"""Step 4 of ``attach_cluster``: HAMi (``releases.hami_release``), its kube-scheduler pinned to the cluster's Kubernetes
version; the step ends when every GPU node advertises its GPUs (``nvidia.com/gpu``) and carries HAMi's registration."""

from __future__ import annotations

import time

from django.conf import settings

from attach import releases
from attach.context import StepContext
from core.exceptions import ApplicationError
from kube.gateway import NODES

TITLE = "HAMi"
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"


def run(ctx: StepContext) -> str:
    """Install or upgrade HAMi, then wait (``GSHARE_ATTACH_GPU_TIMEOUT`` seconds) for the GPUs to be advertised.

    Raises:
        AttachStopped: no HAMi chart fits the cluster's version, Helm failed, or a GPU node advertised nothing in time.
    """
    state = ctx.state
    try:
        release = releases.hami_release(state.git_version)
    except ApplicationError as exc:
        raise ctx.stop(str(exc), "set GSHARE_ATTACH_HAMI_CHART_VERSION (docs/configuration.md)") from None
    done = ctx.install(release)
    deadline = time.monotonic() + settings.GSHARE_ATTACH_GPU_TIMEOUT
    with ctx.kube() as kube:
        while True:
            missing, advertised = [], 0
            for name in sorted(state.gpu_nodes):
                node = kube.get(NODES, name)
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                count = int(allocatable.get("nvidia.com/gpu", "0") or 0)
                if HAMI_REGISTER_ANNOTATION not in ((node.get("metadata") or {}).get("annotations") or {}) or count <= 0:
                    missing.append(name)
                advertised += count
            if not missing:
                break
            if time.monotonic() > deadline:
                raise ctx.stop(f"HAMi's device plugin has not advertised GPUs on {', '.join(missing)} "
                               f"within {settings.GSHARE_ATTACH_GPU_TIMEOUT:.0f} s",
                               "see why: kubectl -n kube-system get pods -l app.kubernetes.io/component=hami-device-plugin "
                               "-o wide; kubectl -n kube-system logs -l app.kubernetes.io/component=hami-device-plugin "
                               "-c device-plugin")
            time.sleep(0.5)
    return f"ok: {done}; {advertised} vGPUs (nvidia.com/gpu) advertised on {len(state.gpu_nodes)} node(s)"
