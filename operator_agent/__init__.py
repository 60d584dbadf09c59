"""gShare data-plane operator (``python -m operator_agent``).

This package runs inside each data-plane cluster. It reads the cluster through its
apiserver and reports to the control plane's ``/internal/v1/`` routes with its operator
token. It must import neither Django nor any control-plane app (``gshare``, ``clusters``,
``sessions``, ``storage``, ``billing``, ``demo``); the rule is enforced by the
import-linter contract in ``.importlinter`` and by ``tests/operator_agent/test_boundary.py``.

Modules:
    main                  the process: its threads (one loop each), signals, logging, ``--once``
    config                ``OperatorConfig`` read from ``os.environ`` and the Kubernetes client factory
    kube                  the Kubernetes gateway: API objects, ``ApiException``, ``KubeUnavailable``
    loop                  the periodic loops (``every``, ``repeat``)
    control_plane_client  HTTP client of the control plane's internal routes (retries, token, clock)
    token                 the operator token: sources, refresh, the token Secret
    clock                 this node's clock offset from the control plane's
    reporters/            one module per report: inventory, status, storage, usage, activity
    sessions/             the session reconciler: reconciler, routing_applier, kopf_handlers
    manifests/            pure builders of the objects the operator writes: session (Pod, Service, PVC), routing/
    session_path          checks of the session path from inside the cluster, sent with the inventory
    hami, hami_pods       decoders of HAMi's node and pod annotations
    hami_monitor          parser of HAMi's vGPU monitor exposition
    metrics               the operator's own ``/metrics``

The wire contract shared with the control plane (paths, labels, annotation keys, error codes, payload schemas) is
the top-level ``contract`` package.
"""

__version__ = "0.2.0"
