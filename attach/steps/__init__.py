"""The steps of ``attach_cluster``, one module each, run in this order by ``attach.run``.

Each module has ``TITLE`` (the progress line's words) and ``run(ctx) -> str`` (the line's result), and either finds its
work already done (and says so), does it, or raises ``attach.context.AttachStopped`` with the exact fix. docs/attach.md
describes each step, its failures and their fixes:

1. ``reach``: the flags, the control plane's API (staff token, same release), the kubeconfig and the apiserver;
2. ``prerequisites``: GPU node prerequisites (a check pod per node: driver, container toolkit, containerd's runtime);
3. ``runtime_class``: the ``nvidia`` RuntimeClass and the labels ``gpu=on`` and ``gshare.io/gpu-mode`` on GPU nodes;
4. ``hami``: HAMi, with its kube-scheduler pinned to the cluster's version, then GPUs advertised;
5. ``ingress``: how session requests enter the cluster: Envoy Gateway and the session Gateway, or ingress-nginx;
6. ``credential``: the control plane's least-privilege ServiceAccount and its token's kubeconfig;
7. ``register``: registration through the control plane's API (an existing one kept and brought up to date);
8. ``deploy_operator``: the operator token Secret (written by the control plane), then the operator's chart;
9. ``storage``: with ``--storage-values``, NFS checks and democratic-csi;
10. ``connection``: the connection test and the operator's first inventory report.
"""
