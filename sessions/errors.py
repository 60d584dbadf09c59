"""The error codes of sessions: creation and placement, connecting, the idle policy, the time limit, and the operator's status and
activity reports. The volume codes placement shares with storage are ``storage.errors``'; the admission codes are
``billing.errors``'; ``report_from_future`` and ``forbidden_cluster_scope`` are the contract's."""

from __future__ import annotations

# --------------------------------------------------------------------------- creation and placement
SESSION_NOT_FOUND = "session_not_found"
"""404: no such session among the caller's."""

NO_CAPACITY = "no_capacity"
"""409: nothing in the fleet (or the pinned cluster) can host the session now."""

PLACEMENT_CONTENDED = "placement_contended"
"""409: concurrent requests took the capacity chosen for the session on each attempt."""

GPU_MODEL_UNKNOWN = "gpu_model_unknown"
"""400: a ``gpu_models`` name that matches none of the fleet's GPU models (the detail lists them)."""

NEVER_FITS = "never_fits"
"""409: no node the request may use could ever host it (too many GPUs for one node, a share larger than any GPU, no
GPU of the accepted models where it may go): it is refused, never queued."""

QUEUE_LIMIT_REACHED = "queue_limit_reached"
"""403: the owner already has their policy's ``max_queued_sessions`` waiting in the queue."""

QUEUE_WAITING = "queue_waiting"
"""409: an owner's extension while queued sessions wait for GPUs like the session's (staff may still extend it)."""

PRIORITY_FORBIDDEN = "priority_forbidden"
"""403: only staff may change a queued session's priority."""

SESSION_NOT_QUEUED = "session_not_queued"
"""409: the session is not waiting in the queue (its priority no longer matters)."""

VOLUME_ON_ANOTHER_CLUSTER = "volume_on_another_cluster"
"""409: the session is pinned to one cluster, but a volume's PVC is on another."""

VOLUMES_ON_DIFFERENT_CLUSTERS = "volumes_on_different_clusters"
"""409: two of the session's volumes are held by different clusters."""

# --------------------------------------------------------------------------- connecting
SESSION_NOT_RUNNING = "session_not_running"
"""409: a connect link for a session that ended."""

CONNECT_REFUSED = "connect_refused"
"""401: a valid connect token that does not fit the request (another session, host or path)."""

CONNECT_FORBIDDEN = "connect_forbidden"
"""403: a valid connect token whose user is deactivated, or no longer the owner nor staff."""

VERIFY_UNAVAILABLE = "verify_unavailable"
"""503: the connect verify cannot decide now (PostgreSQL or Redis unreachable or too slow)."""

# --------------------------------------------------------------------------- idle policy
INVALID_EXEMPTION = "invalid_exemption"
"""400: an idle exemption ``until`` in the past or more than a year ahead."""

IDLE_EXEMPTION_FORBIDDEN = "idle_exemption_forbidden"
"""403: an idle exemption asked by someone who may not manage everyone's sessions."""

SESSION_NOT_LIVE = "session_not_live"
"""409: an idle exemption or a time-limit extension for a session that has ended (or, for an extension, is stopping)."""

# --------------------------------------------------------------------------- time limit
RUNTIME_OVER_LIMIT = "runtime_over_limit"
"""400: ``runtime_hours`` (or an owner's extension) takes a session past its policy's ``max_runtime_hours``."""

EXTEND_FORBIDDEN = "extend_forbidden"
"""403: an extension asked by someone who is neither the session's owner nor staff who may manage every session."""

NO_TIME_LIMIT = "no_time_limit"
"""409: an extension of a session that has no time limit."""

# --------------------------------------------------------------------------- CPU and memory
CPU_OVER_LIMIT = "cpu_over_limit"
"""400: ``cpu`` over the policy's ``max_cpu_per_gpu`` × the GPUs asked."""

MEMORY_OVER_LIMIT = "memory_over_limit"
"""400: ``memory_gib`` over the policy's ``max_memory_gib_per_gpu`` × the GPUs asked."""

# --------------------------------------------------------------------------- operator API
INVALID_STATUS = "invalid_status"
"""400: a status report does not match the contract."""

INVALID_ACTIVITY = "invalid_activity"
"""400: an activity report does not match the contract (or lists a session or GPU twice, a bad time...)."""
