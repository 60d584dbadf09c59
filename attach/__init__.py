"""The attach command (``manage.py attach_cluster``, docs/attach.md): prepares a GPU cluster, registers it with the
control plane and deploys its operator, from any machine with the cluster's admin kubeconfig and a staff API token.

``run`` runs ``steps`` (one module per step) in order; ``context`` is what the steps share; ``api_client`` is the only
way to the control plane (its public API: attach imports no app and no database layer); ``checks``, ``credential``,
``releases``, ``helm`` and ``fixes`` are the check pods, the control plane's RBAC, the Helm releases, their installing
and the fix sentences; ``bootstrap_storage`` installs storage alone (``hack/cluster-bootstrap.sh storage``).
"""
