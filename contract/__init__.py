"""Values the operator and the control plane share: routes, labels, error codes, token constants, and the JSON
Schemas (Draft 2020-12) of every payload the operator sends.

The control plane imports this module; this module imports nothing from the control
plane (nor anything but the standard library), so both sides can depend on it.
Change a value here and both sides change together: the control plane validates what it receives against these
schemas (``clusters.internal.schemas``, ``sessions.internal.views``, ``storage.internal.views``; usage through the
hand-written ``billing.usage.parse_samples``, tested against ``USAGE_SCHEMA``), and the operator's tests validate
what it builds against them. ``"format": "date-time"`` fields are RFC 3339 as ``contract.rfc3339.parse``
reads them; the control plane checks them with that function (for its own error messages), not as a schema format.
"""

from __future__ import annotations

import hashlib
import json

# --------------------------------------------------------------------------- HTTP routes
INTERNAL_API_PREFIX = "/internal/v1"
"""Prefix of every operator-facing route on the control plane (JSON, ``Authorization: Bearer``)."""

INVENTORY_PATH = "/internal/v1/inventory"
"""``PUT``: full snapshot of the cluster's GPU nodes and devices (see ``operator_agent.reporters.inventory``).

Body: ``{"nodes": [{"name", "labels", "ready", "devices": [...], "hami_error"?}], "digest"?, "checks"?}``.
The control plane upserts what is listed and removes what is gone, for the cluster named
in the token, and records ``digest`` (``inventory_digest`` of ``nodes``) when it answers it back.

Digest-only body: ``{"digest", "checks"?}`` (no ``nodes``): the snapshot is unchanged since the one the control plane
answered that digest to. It counts as the same report without reading or writing any node; a control plane whose
recorded digest is another answers 409 ``INVENTORY_SNAPSHOT_REQUIRED`` and the operator sends the full snapshot.
"""

INVENTORY_DIGEST_PREFIX = "sha256:"
"""Prefix of an inventory digest; 64 lowercase hex digits follow."""


def inventory_digest(nodes: list) -> str:
    """The digest of an inventory snapshot's ``nodes``: ``sha256:`` + the SHA-256 (hex) of their canonical JSON.

    Canonical JSON: ``json.dumps(nodes, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` encoded as UTF-8,
    so two snapshots with the same content have the same digest whatever the order of their keys (the order of the
    nodes and of each node's devices counts: ``operator_agent.reporters.inventory`` sorts them).
    """
    canonical = json.dumps(nodes, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return INVENTORY_DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest()


# --------------------------------------------------------------------------- node labels
GPU_NODE_LABEL_KEY = "gpu"
"""Label key that marks a node as a gShare GPU node (value ``GPU_NODE_LABEL_VALUE``)."""

GPU_NODE_LABEL_VALUE = "on"
"""Label value of ``GPU_NODE_LABEL_KEY`` on GPU nodes: nodes carry ``gpu=on``."""

GPU_NODE_LABEL_SELECTOR = f"{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}"
"""Kubernetes label selector (``gpu=on``) used to list GPU nodes."""

GPU_MODE_LABEL = "gshare.io/gpu-mode"
"""Node label naming the GPU sharing mode gShare uses on that node.

The operator reports it unchanged inside the node's ``labels``; the control plane
interprets the value.
"""

# --------------------------------------------------------------------------- HAMi annotations
HAMI_NODE_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
"""Node annotation written by ``hami-device-plugin`` listing the node's NVIDIA GPUs.

Format: see ``operator_agent.hami`` (legacy 7/9-field strings up to HAMi v2.7.x, a JSON
array from v2.8.0). Key in use since HAMi commit 7c670f49 (2024-02-27, hami-2.3 and later).
"""

HAMI_LEGACY_NODE_REGISTER_ANNOTATION = "4pd.io/node-nvidia-register"
"""Pre-HAMi key of the same annotation (``4pd.io/k8s-vgpu-scheduler`` v2.2.9 … HAMi master 2024-02).

Format: legacy 5-, 6- or 7-field strings (see ``operator_agent.hami``).
"""

HAMI_NODE_REGISTER_ANNOTATIONS = (HAMI_NODE_REGISTER_ANNOTATION, HAMI_LEGACY_NODE_REGISTER_ANNOTATION)
"""Annotation keys in the order they are looked up: current key first, then the legacy one."""

# --------------------------------------------------------------------------- operator token
OPERATOR_TOKEN_SUBJECT_PREFIX = "operator:"
"""Operator tokens carry ``sub = "operator:<cluster_id>"`` (RS256 internal JWT, 7-day TTL)."""

OPERATOR_TOKEN_SECRET_NAMESPACE = "gshare-system"
"""Namespace of the data-plane Secret holding the operator token."""

OPERATOR_TOKEN_SECRET_NAME = "gshare-operator-internal-jwt"
"""Name of the data-plane Secret holding the operator token."""

OPERATOR_TOKEN_SECRET_KEY = "internal-jwt"
"""Key inside that Secret; mounted as a file and re-read on every request (rotation without restart)."""

DEFAULT_TOKEN_FILE = "/var/run/secrets/gshare/internal-jwt"
"""Default path where the operator chart mounts ``OPERATOR_TOKEN_SECRET_KEY``."""

OPERATOR_TOKEN_GENERATION_CLAIM = "gen"
"""Claim carrying the cluster's credential generation in every operator token (absent = generation 1).

The control plane refuses a token whose generation is not the cluster's current one (401 ``token_revoked``).
"""

OPERATOR_TOKEN_REFRESH_FRACTION = 0.25
"""The operator refreshes its token once less than this fraction of its life is left (``operator_agent.token``,
lowered by its jitter); the control plane exchanges a token only inside that window (``clusters.operator_token``)."""

TOKEN_PATH = "/internal/v1/token"
"""``POST`` (no body): exchange the caller's valid operator token for a fresh one of the cluster's current
generation. Answers ``{"token": "<JWT>", "expires_at": RFC 3339 UTC, "generation": int, "server_time": ...}``.
"""

# --------------------------------------------------------------------------- sessions
GSHARE_API_GROUP = "gshare.io"
"""API group of the ``GShareSession`` custom resource the control plane applies to a cluster."""

GSHARE_SESSION_KIND = "GShareSession"
"""Kind of the custom resource the operator reconciles into Pod, Service, Ingress and PVC objects."""

PHASE_PENDING = "Pending"
"""Session accepted by the operator, pod not running yet."""

PHASE_RUNNING = "Running"
"""Session pod running."""

PHASE_SUCCEEDED = "Succeeded"
"""Session pod ended with success."""

PHASE_FAILED = "Failed"
"""Session pod ended with failure or could not be started."""

PHASE_TERMINATED = "Terminated"
"""Session stopped on request (user, quota or credit)."""

SESSION_PHASES = (PHASE_PENDING, PHASE_RUNNING, PHASE_SUCCEEDED, PHASE_FAILED, PHASE_TERMINATED)
"""Phases reported by ``POST /internal/v1/status``, in lifecycle order."""

# --------------------------------------------------------------------------- error codes
# Every control-plane error body is ``{"code": "<one of these or another snake_case code>", "detail": "..."}``.

FORBIDDEN_CLUSTER_SCOPE = "forbidden_cluster_scope"
"""403: the request touches a session, node or device of a cluster other than the token's; nothing changed."""

INVENTORY_SNAPSHOT_REQUIRED = "inventory_snapshot_required"
"""409 to a digest-only ``PUT INVENTORY_PATH``: the control plane's last applied snapshot of the cluster is not the one with
that digest (or it recorded none); nothing changed. The operator sends its full snapshot at once."""

REPORT_FROM_FUTURE = "report_from_future"
"""409 to ``POST STATUS_PATH``: a report's ``observed_at`` is further ahead of the control plane's clock than its
tolerance (``GSHARE_CLOCK_SKEW_TOLERANCE``); nothing of the batch was applied. The body also carries ``server_time`` and
``ahead_seconds``: the operator logs them with the fix (NTP on its node) and sends the reports again stamped no later
than the control plane's time, once, instead of retrying the same body."""

TOKEN_INVALID = "token_invalid"
"""401: the operator token is missing, malformed, expired, or signed by an unknown key."""

CLUSTER_DEREGISTERED = "cluster_deregistered"
"""401: the token's cluster has been deregistered; its tokens are no longer accepted."""

TOKEN_REVOKED = "token_revoked"
"""401: the token's credential generation (claim ``gen``) is not the cluster's current one: it was revoked."""

# --------------------------------------------------------------------------- GShareSession contract
GSHARE_API_VERSION = "v1alpha1"
"""Version of the ``GShareSession`` custom resource (``gshare.io/v1alpha1``)."""

GSHARE_SESSION_PLURAL = "gsharesessions"
"""Plural (URL) name of the ``GShareSession`` resource."""

SESSION_NAMESPACE_DEFAULT = "gshare-sessions"
"""Namespace where the control plane applies ``GShareSession`` objects (configurable on both sides)."""

SESSION_ID_LABEL = "gshare.io/session-id"
"""Label carrying the public session id (``ses_...``) on the GShareSession and every object made for it."""

CLUSTER_ID_LABEL = "gshare.io/cluster-id"
"""Label carrying the cluster's public id (``clu_...``) on the GShareSession."""

SESSION_PORT_DEFAULT = 8888
"""Container port of the session's interactive server (Jupyter's default)."""

STATUS_PATH = "/internal/v1/status"
"""``POST``: session phase reports, body ``{"reports": [StatusReport, ...]}`` (at most 500 per call).

A StatusReport is ``{"session": "ses_...", "phase": one of SESSION_PHASES, "node": str | null,
"devices": [GPU UUID, ...], "message": str, "observed_at": RFC 3339 UTC}``. Reports are idempotent and
may arrive out of order: the control plane ignores a report older than the last one it applied, and a
session in a terminal phase (Succeeded, Failed, Terminated) never goes back. A report naming a session
of another cluster refuses the whole call with 403 ``forbidden_cluster_scope``.
"""

STORAGE_PATH = "/internal/v1/storage"
"""``POST``: the volume-sync report of one cluster (``operator_agent.reporters.storage``), every ``GSHARE_VOLUME_SYNC_INTERVAL`` s.

Body::

    {"read_at": RFC 3339 UTC,
     "storage_classes": [{"storage_class": "nfs-a", "capacity_bytes": int | null, "objects": int}],
     "existing_storage_classes": ["local-path", "nfs-a"],
     "volumes": [{"volume_id": "vol_...", "claim_name": "gshare-vol-...", "phase": one of VOLUME_PHASES,
                  "volume_name": "pvc-..." or "", "message": str}],
     "nodes": [{"name": "node-1", "disk_bytes": int}]}

``capacity_bytes`` is the *largest* ``capacity`` among the StorageClass's CSIStorageCapacity objects (one per
topology segment, all describing the same server: never their sum), ``null`` when none publishes one;
``objects`` counts them. ``existing_storage_classes`` names every StorageClass object of the cluster (sorted); the
control plane uses a pool on the cluster only when the pool's StorageClass is among them. It is optional: an operator
that cannot list StorageClasses (or predates the field) leaves it out, and nothing is then known. ``volumes`` lists
every PVC of the session namespace labelled ``VOLUME_ID_LABEL``;
``message`` says why a volume is not usable (the PVC's newest event while ``Pending``, or the ``FailedMount``
event of a pod stuck mounting it), ``""`` otherwise. ``disk_bytes`` is the node's ``ephemeral-storage`` capacity.
"""

USAGE_PATH = "/internal/v1/usage"
"""``POST``: a batch of usage samples (``operator_agent.reporters.usage``), oldest first, at most ``USAGE_MAX_SAMPLES_PER_CALL``.

Body::

    {"samples": [{"sample_id": "ses_...:GPU-...:1764432000123", "session_id": "ses_...", "device_uuid": "GPU-...",
                  "start": "2026-11-29T15:59:00.123Z", "end": "2026-11-29T16:00:00.123Z",
                  "gpu_util_percent": null, "memory_used_mib": null}]}

``sample_id`` is chosen by the operator and unique per cluster (``<session_id>:<device_uuid>:<window end, epoch ms>``);
``start``/``end`` are ISO 8601 UTC, ``end - start`` at most ``USAGE_MAX_WINDOW_SECONDS``; the last two fields are
optional (``null``). Idempotent on ``(cluster, sample_id)``: resending is always safe. Answers 200
``{"server_time", "accepted", "duplicates", "charged"}``; 400 ``INVALID_USAGE_SAMPLE`` with ``index`` (the position of
the offending sample in ``samples``; nothing of the batch stored); 403 ``FORBIDDEN_CLUSTER_SCOPE`` (a sample names a
session or device of another cluster; nothing stored); 401 token problems.
"""

ACTIVITY_PATH = "/internal/v1/activity"
"""``POST``: the GPU activity of the cluster's Running sessions (``operator_agent.reporters.activity``), every
``GSHARE_ACTIVITY_INTERVAL`` s, read from HAMi's vGPU monitor on each node that runs a session.

Body::

    {"sessions": [{"session": "ses_...", "node": "gpu-h100-01", "state": "ok" | "unknown", "reason": str,
                   "sampled_at": RFC 3339 UTC,
                   "gpus": [{"device_uuid": "GPU-...", "last_kernel_seconds": 12.0 | null,
                             "utilization_percent": 87.0 | null, "memory_used_bytes": int | null,
                             "memory_limit_bytes": int | null, "sampled_at": RFC 3339 UTC}]}]}

One entry per Running session the operator knows, at most ``ACTIVITY_MAX_SESSIONS``. ``state`` is ``ok`` when the
node's monitor answered and was parsed (``reason`` ""), ``unknown`` when it could not be scraped or read (``reason``
says why: no monitor pod on the node, the proxy's status, a timeout, unparseable text); an unknown entry's ``gpus``
is empty: activity is never reported as zero for want of a reading. In an ``ok`` entry every GPU of the session is
listed; a GPU for which the monitor lists no series of the session's container (it never initialised CUDA there) has
every value ``null``. ``last_kernel_seconds`` is HAMi's seconds since the container last launched a kernel on that
GPU, ``utilization_percent`` its SM utilization (0-100), the memory values its vGPU memory used and limit, in bytes.
Answers 200 ``{"server_time", "accepted", "ignored"}``; 400 ``invalid_activity``; 403 ``FORBIDDEN_CLUSTER_SCOPE`` when an entry names a session of another
cluster or one the control plane does not know (nothing stored); entries of sessions that are no longer Running are
ignored.
"""

ACTIVITY_MAX_SESSIONS = 1000
"""``POST ACTIVITY_PATH`` carries at most this many session entries: at 64 GPUs each, still under the control plane's
32 MiB body limit (the operator sends a larger cluster's report in several calls)."""

ACTIVITY_STATE_OK = "ok"
ACTIVITY_STATE_UNKNOWN = "unknown"
ACTIVITY_STATES = (ACTIVITY_STATE_OK, ACTIVITY_STATE_UNKNOWN)
"""``state`` of an activity entry: the monitor was read (``ok``) or not (``unknown``, with the reason)."""

HAMI_MONITOR_PORT_DEFAULT = 9394
"""Container port of HAMi's ``vGPUmonitor`` (``/metrics``, Prometheus text format) in the ``hami-device-plugin`` pod."""

HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT = "app.kubernetes.io/component=hami-device-plugin"
"""Label selector of the pods of HAMi's device-plugin DaemonSet (``charts/hami`` ``daemonsetnvidia.yaml``), whose
``vGPUmonitor`` container serves the monitor."""

USAGE_MAX_SAMPLES_PER_CALL = 5000
"""``POST /internal/v1/usage`` accepts at most this many samples per call."""

USAGE_MAX_WINDOW_SECONDS = 600
"""Longest window (``end - start``) of one usage sample, in seconds; the operator splits longer gaps."""

INVALID_USAGE_SAMPLE = "invalid_usage_sample"
"""400 of ``POST /internal/v1/usage``: sample number ``index`` of the batch is malformed (end before start, window
longer than ``USAGE_MAX_WINDOW_SECONDS``, unknown session ...); nothing of the batch was stored."""

ERROR_CODES = (FORBIDDEN_CLUSTER_SCOPE, INVENTORY_SNAPSHOT_REQUIRED, REPORT_FROM_FUTURE, TOKEN_INVALID, CLUSTER_DEREGISTERED,
               TOKEN_REVOKED, INVALID_USAGE_SAMPLE)
"""The error codes above: those the control plane answers and the operator reads (each app's other codes are in its
``errors`` module)."""

VOLUME_ID_LABEL = "gshare.io/volume-id"
"""Label carrying the public volume id (``vol_...``) on the volume's PersistentVolumeClaim (and PersistentVolume)."""

VOLUME_NAME_LABEL = "gshare.io/volume-name"
"""Label carrying the volume's name (a DNS label, mounted at ``/data/<name>``) on its PersistentVolumeClaim."""

VOLUME_MANAGED_BY = "gshare"
"""Value of ``app.kubernetes.io/managed-by`` on volume PVCs: written by the operator, or by the control plane when it
moves a volume; the PVC has no owner (the volume outlives every session)."""

VOLUME_PHASE_BOUND = "Bound"
VOLUME_PHASE_PENDING = "Pending"
VOLUME_PHASE_LOST = "Lost"
VOLUME_PHASES = (VOLUME_PHASE_PENDING, VOLUME_PHASE_BOUND, VOLUME_PHASE_LOST)
"""PersistentVolumeClaim phases (``status.phase``) as reported in ``POST /internal/v1/storage``."""

CONNECT_VERIFY_PATH = "/internal/connect/verify"
"""The ingress-nginx ``auth-url`` of every session Ingress (answers 2xx or 401/403 only)."""

CONNECT_EXT_AUTHZ_PATH = "/internal/connect/ext-authz"
"""Path prefix of Envoy's HTTP ext_authz check (Envoy Gateway ``SecurityPolicy.spec.extAuth.http.path``): Envoy sends
``<prefix><original path and query>`` with the original method and ``:authority``; answers like the verify (200, 401, 403,
503), and a connect link's first request 307 with the cookie (Envoy Gateway passes a denial's headers to the client, not
an allowed answer's)."""

ROUTING_GATEWAY_API = "gateway-api"
"""Routing mode: a Gateway API ``HTTPRoute`` per session on the cluster's Gateway, guarded by Envoy Gateway's
``SecurityPolicy`` ``extAuth`` (the mode ``attach_cluster`` installs by default)."""
ROUTING_INGRESS_NGINX = "ingress-nginx"
"""Routing mode: a ``networking.k8s.io/v1`` Ingress per session with ingress-nginx's ``auth-url`` (retired upstream on
2026-03-24; kept for clusters that already run it)."""
ROUTING_MODES = (ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX)
"""``spec.routing`` of a GShareSession and ``routing`` of a cluster."""

GATEWAY_NAME_DEFAULT = "gshare-sessions"
"""Name of the Gateway session HTTPRoutes attach to (``spec.gateway.name``) unless the cluster names another."""
GATEWAY_NAMESPACE_DEFAULT = "gshare-system"
"""Namespace of that Gateway (``spec.gateway.namespace``)."""

SESSION_DOMAIN_RESOLVES = "session_domain_resolves"
"""Operator check: the cluster's ``session_domain`` resolves, inside the cluster, to an address of its ingress node."""

VERIFY_REACHABLE = "verify_reachable"
"""Operator check: the session Ingresses' ``auth-url`` (``connect_verify_url``) -- on a ``gateway-api`` cluster the ext_authz
URL (``connect_ext_authz_url``) -- answers, from inside the cluster, 401 with the control plane's JSON to a request
without a token (not a connection error, not an HTML page)."""

CLOCK_SYNCED = "clock_synced"
"""Check of the connection test and the cluster page (not reported by the operator as a check): the operator's clock is
within the tolerance of the control plane's, judged by the ``clock_offset_seconds`` it reports with its inventory."""

CLOCK_OFFSET_LIMIT = 1e10
"""Largest ``clock_offset_seconds`` magnitude an inventory may carry (about 317 years: any real clock's error, however
wrong; an operator reports a larger one as this bound)."""

OPERATOR_CHECKS = (SESSION_DOMAIN_RESOLVES, VERIFY_REACHABLE)
"""The checks an operator reports in its inventory (``checks``); operators that predate them report none (the field is optional)."""

INVENTORY_RESPONSE_SESSION_PATH_KEYS = ("session_domain", "ingress_node", "connect_verify_url")
"""Keys of the ``PUT INVENTORY_PATH`` answer that tell the operator what to check: the cluster's ``session_domain`` and
``ingress_node`` as registered, and the ``auth-url`` the control plane puts on session Ingresses (strings, may be "")."""

INVENTORY_RESPONSE_ROUTING_KEYS = ("routing", "connect_ext_authz_url")
"""Keys of the ``PUT INVENTORY_PATH`` answer naming the cluster's routing mode (``ROUTING_MODES``) and the ext_authz URL
prefix session SecurityPolicies send Envoy's checks to (control plane URL + ``CONNECT_EXT_AUTHZ_PATH``). On a
``gateway-api`` cluster the operator's ``verify_reachable`` probes that URL instead of ``connect_verify_url``; a control
plane that sends neither is taken as ``ingress-nginx``."""


# --------------------------------------------------------------------------- payload schemas
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_TIME = {"type": "string", "maxLength": 64, "format": "date-time"}

_INVENTORY_DEVICE = {
    "type": "object",
    "required": ["uuid", "index", "model", "memory_mib", "split_count", "cores", "health"],
    "properties": {
        "uuid": {"type": "string", "minLength": 1, "maxLength": 128},
        "index": {"type": "integer", "minimum": 0, "maximum": _INT32},
        "model": {"type": "string", "minLength": 1, "maxLength": 128},
        "memory_mib": {"type": "integer", "minimum": 0, "maximum": _INT32},
        "split_count": {"type": "integer", "minimum": 1, "maximum": _INT32},
        "cores": {"type": "integer", "minimum": 0, "maximum": _INT32},
        "health": {"type": "boolean"},
        "mode": {"type": ["string", "null"], "maxLength": 32},
    },
}

INVENTORY_RESOURCE_FIELDS = ("cpu_allocatable_millicores", "memory_allocatable_mib", "cpu_requested_millicores", "memory_requested_mib")
"""A node's CPU (millicores) and memory (MiB) in an inventory snapshot: ``status.allocatable``, and what its pods that are
not sessions request (``operator_agent.reporters.inventory``)."""

INVENTORY_RESOURCE_MAX = 2**40
"""Largest CPU or memory figure of a node (about 10^12 millicores or MiB: far beyond any node)."""

_OPERATOR_CHECK = {
    "type": "object",
    "required": ["ok", "detail", "checked_at"],
    "properties": {
        "ok": {"type": "boolean"},
        "detail": {"type": "string", "maxLength": 1000},
        "checked_at": _TIME,
    },
}

INVENTORY_DIGEST_PATTERN = "^sha256:[0-9a-f]{64}$"
#: Its exact length: the pattern's ``$`` (JSON Schema and ``re.search``) also matches before a final newline.
INVENTORY_DIGEST_LENGTH = len("sha256:") + 64
"""``digest`` of an inventory body (``inventory_digest``)."""

INVENTORY_SCHEMA = {
    "type": "object",
    "properties": {
        "digest": {"type": "string", "pattern": INVENTORY_DIGEST_PATTERN, "maxLength": INVENTORY_DIGEST_LENGTH},
        # Optional: operators that predate the checks send none (the control plane then shows them as unknown). Names
        # it does not know are ignored, so a newer operator's extra checks do not make its reports invalid.
        "checks": {"type": "object", "maxProperties": 16, "propertyNames": {"maxLength": 64},
                   "additionalProperties": _OPERATOR_CHECK},
        # Optional (operators that predate it send none: the clock check is then unknown). Seconds to add to the
        # operator's clock to get the control plane's, from the ``server_time`` of its last answer (the midpoint of
        # that call's round trip).
        "clock_offset_seconds": {"type": "number", "minimum": -CLOCK_OFFSET_LIMIT, "maximum": CLOCK_OFFSET_LIMIT},
        "nodes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["name", "ready", "devices"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "ready": {"type": "boolean"},
                    "hami_error": {"type": "string"},
                    "devices": {"type": "array", "maxItems": 64, "items": _INVENTORY_DEVICE},
                    # Optional (operators that predate them send none: the node then has no CPU or memory limit in
                    # placement). The allocatable figures are rounded down, the requested ones (pods that are not
                    # sessions) up.
                    **{name: {"type": "integer", "minimum": 0, "maximum": INVENTORY_RESOURCE_MAX} for name in INVENTORY_RESOURCE_FIELDS},
                },
            },
        }
    },
}
"""Body of ``PUT INVENTORY_PATH``: a full snapshot (``nodes``, with its ``digest`` or without) or a digest-only report
(``digest`` alone); one of the two is required. Node names and GPU UUIDs are also unique in a snapshot (these two rules
are not expressed here)."""

STATUS_MAX_REPORTS = 500
"""``POST STATUS_PATH`` carries at most this many reports."""

STATUS_SCHEMA = {
    "type": "object",
    "required": ["reports"],
    "properties": {
        "reports": {
            "type": "array",
            "maxItems": STATUS_MAX_REPORTS,
            "items": {
                "type": "object",
                "required": ["session", "phase", "observed_at"],
                "properties": {
                    "session": {"type": "string", "pattern": "^ses_[a-z0-9]{1,32}$"},
                    "phase": {"enum": list(SESSION_PHASES)},
                    "node": {"type": ["string", "null"], "maxLength": 253},
                    "devices": {"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 128}},
                    "message": {"type": ["string", "null"], "maxLength": 4000},
                    "observed_at": _TIME,
                },
            },
        }
    },
}
"""Body of ``POST STATUS_PATH``."""

STORAGE_REPORT_SCHEMA = {
    "type": "object",
    "required": ["read_at"],
    "properties": {
        "read_at": _TIME,
        "storage_classes": {
            "type": "array",
            "maxItems": 1000,
            "items": {
                "type": "object",
                "required": ["storage_class"],
                "properties": {
                    "storage_class": {"type": "string", "minLength": 1, "maxLength": 253},
                    "capacity_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": _INT64},
                    "objects": {"type": "integer", "minimum": 0, "maximum": _INT32},
                },
            },
        },
        # Optional: an operator older than the field does not send it, and nothing is then known of its StorageClasses.
        "existing_storage_classes": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "string", "minLength": 1, "maxLength": 253},
        },
        "volumes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["volume_id", "phase"],
                "properties": {
                    "volume_id": {"type": "string", "pattern": "^vol_[a-z0-9]{1,32}$"},
                    "claim_name": {"type": "string", "maxLength": 253},
                    "phase": {"enum": [VOLUME_PHASE_BOUND, VOLUME_PHASE_PENDING, VOLUME_PHASE_LOST]},
                    "volume_name": {"type": ["string", "null"], "maxLength": 253},
                    "message": {"type": ["string", "null"], "maxLength": 4000},
                },
            },
        },
        "nodes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["name", "disk_bytes"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "disk_bytes": {"type": "integer", "minimum": 0, "maximum": _INT64},
                },
            },
        },
    },
}
"""Body of ``POST STORAGE_PATH`` (docs/storage.md#operator-report). StorageClasses, volumes, nodes and the names of
``existing_storage_classes`` are each listed once (not expressible here)."""

USAGE_ID_MAX_LENGTH = 128
"""Longest ``sample_id``, ``session_id`` and ``device_uuid`` of a usage sample (the columns' size)."""

_USAGE_ID = {"type": "string", "minLength": 1, "maxLength": USAGE_ID_MAX_LENGTH}

USAGE_RESERVED_ID_PREFIX = "gap:"
"""A ``sample_id`` may not begin with it: the control plane's own rows of held GPU time no sample covered use it."""

USAGE_SAMPLE_SCHEMA = {
    "type": "object",
    "required": ["sample_id", "session_id", "device_uuid", "start", "end"],
    "properties": {
        "sample_id": {**_USAGE_ID, "not": {"pattern": "^" + USAGE_RESERVED_ID_PREFIX}},
        "session_id": _USAGE_ID,
        "device_uuid": _USAGE_ID,
        "start": _TIME,
        "end": _TIME,
        "gpu_util_percent": {"type": ["number", "null"], "minimum": 0, "maximum": 100},
        "memory_used_mib": {"type": ["integer", "null"], "minimum": 0, "maximum": _INT32},
    },
}
"""One usage sample. Beyond the schema: ids hold no NUL, ``end`` is after ``start`` and at most
``USAGE_MAX_WINDOW_SECONDS`` later, and whole numbers are JSON integers (``1``, not ``1.0``)."""

USAGE_SCHEMA = {
    "type": "object",
    "required": ["samples"],
    "properties": {"samples": {"type": "array", "maxItems": USAGE_MAX_SAMPLES_PER_CALL, "items": USAGE_SAMPLE_SCHEMA}},
}
"""Body of ``POST USAGE_PATH``."""


_ACTIVITY_GPU = {
    "type": "object",
    "required": ["device_uuid", "last_kernel_seconds", "utilization_percent", "memory_used_bytes", "memory_limit_bytes",
                 "sampled_at"],
    "properties": {
        "device_uuid": {"type": "string", "minLength": 1, "maxLength": 128},
        "last_kernel_seconds": {"type": ["number", "null"], "minimum": 0, "maximum": 1e12},
        "utilization_percent": {"type": ["number", "null"], "minimum": 0, "maximum": 100},
        "memory_used_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": _INT64},
        "memory_limit_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": _INT64},
        "sampled_at": _TIME,
    },
}

ACTIVITY_SCHEMA = {
    "type": "object",
    "required": ["sessions"],
    "properties": {
        "sessions": {
            "type": "array",
            "maxItems": ACTIVITY_MAX_SESSIONS,
            "items": {
                "type": "object",
                "required": ["session", "state", "reason", "sampled_at", "gpus"],
                "properties": {
                    "session": {"type": "string", "pattern": "^ses_[a-z0-9]{1,32}$"},
                    "node": {"type": ["string", "null"], "maxLength": 253},
                    "state": {"enum": list(ACTIVITY_STATES)},
                    "reason": {"type": "string", "maxLength": 1000},
                    "sampled_at": _TIME,
                    "gpus": {"type": "array", "maxItems": 64, "items": _ACTIVITY_GPU},
                },
            },
        }
    },
}
"""Body of ``POST ACTIVITY_PATH``. Sessions are listed once, and a session's GPUs once each (not expressible here)."""


def session_object_name(session_id: str) -> str:
    """Kubernetes object name for a session id: ``ses_ab12`` -> ``ses-ab12`` (DNS-1123: no ``_``)."""
    return session_id.replace("_", "-")
