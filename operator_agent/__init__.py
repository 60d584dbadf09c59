"""gShare data-plane operator (``python -m operator_agent``).

This package runs inside each data-plane cluster. It reads the cluster through its
apiserver and reports to the control plane's ``/internal/v1/`` routes with its operator
token. It must import neither Django nor any control-plane app (``gshare``, ``clusters``,
``sessions``, ``storage``, ``billing``, ``demo``); the rule is enforced by the
import-linter contract in ``.importlinter`` and by ``tests/operator_agent/test_boundary.py``.

Modules:
    contract       values shared with the control plane (paths, labels, annotation keys, error codes)
    hami           decoder for HAMi's node-registration annotation
    config         ``OperatorConfig`` read from ``os.environ`` and the Kubernetes client factory
    inventory      GPU node/device snapshot built from the Kubernetes API
    control_plane  HTTP client for the control plane's internal routes
    main           the process loop (signals, ticks, logging)
"""

__version__ = "0.2.0"
