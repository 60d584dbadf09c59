"""Step 3 of ``attach_cluster``: the RuntimeClass ``nvidia`` (handler ``nvidia``) and the GPU node labels (``gpu=on``
and ``gshare.io/gpu-mode``, whose value an operator may have set already)."""

from __future__ import annotations

from attach.context import StepContext, name_of
from contract import GPU_MODE_LABEL, GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE
from kube.gateway import NODES, RUNTIME_CLASSES

TITLE = "RuntimeClass nvidia and GPU node labels"
DEFAULT_GPU_MODE = "hami-core"


def run(ctx: StepContext) -> str:
    """Create the RuntimeClass when missing and label the GPU nodes step 2 found.

    Raises:
        AttachStopped: a RuntimeClass ``nvidia`` exists with another handler.
    """
    state = ctx.state
    with ctx.kube() as kube:
        runtime_class = "present"
        existing = kube.get(RUNTIME_CLASSES, "nvidia", missing_ok=True)
        if existing is None:
            kube.create({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
            runtime_class = "created"
        elif existing.get("handler") != "nvidia":
            raise ctx.stop(f"RuntimeClass nvidia exists with handler {existing.get('handler')!r}, not 'nvidia'",
                           "kubectl delete runtimeclass nvidia")
        labelled = 0
        for node in state.nodes:
            if name_of(node) not in state.gpu_nodes:
                continue
            labels = (node.get("metadata") or {}).get("labels") or {}
            wanted = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE, GPU_MODE_LABEL: labels.get(GPU_MODE_LABEL) or DEFAULT_GPU_MODE}
            if all(labels.get(k) == v for k, v in wanted.items()):
                continue
            kube.patch(NODES, name_of(node), {"metadata": {"labels": wanted}})
            labelled += 1
    return f"ok: RuntimeClass nvidia {runtime_class}; {labelled} node(s) labelled, {len(state.gpu_nodes) - labelled} already labelled"
