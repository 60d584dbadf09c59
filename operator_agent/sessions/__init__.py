"""The session reconciler: GShareSession -> PersistentVolumeClaims, Pod, Service, routing objects, and its status.

Modules:
    reconciler       ``SessionReconciler``: makes a session's children exist and keeps its ``status`` current
    routing_applier  applies a session's routing objects (``operator_agent.manifests.routing``) and the ``/s/`` fallback
    kopf_handlers    the Kopf handlers and settings, and ``run_sessions``, the thread that runs Kopf

The status a Pod implies and the reports of it to the control plane are ``operator_agent.reporters.status``.
"""
