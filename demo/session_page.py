"""The demo's stand-in for a session pod: a small HTML page about the session behind an Ingress backend.

A cluster's ingress proxies ``/s/<session id>/...`` to the session Service and its pod (JupyterLab in the
real image). The emulator runs no containers, so the demo ingress (``demo.ingress_nginx``) answers for the pod
with this page, built from what the emulated apiserver holds: the Service the Ingress names, the Running
Pod it selects (node, HAMi's GPU allocation, volume mounts) and the ``GShareSession`` (owner, volume sizes).
No Django here: the ingress runs as its own process.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract import SESSION_ID_LABEL
from operator_agent.hami import HamiDecodeError
from operator_agent.hami_pods import HAMI_POD_DEVICES_ALLOCATED_ANNOTATION, decode_pod_devices

#: ``get(path) -> JSON dict`` on one emulated apiserver (``demo.ingress_nginx.ClusterApi.get``), None on 404.
Getter = Callable[[str], "dict[str, Any] | None"]


@dataclass
class PodFacts:
    """What the page shows about a session's pod.

    Attributes:
        session_id: the ``gshare.io/session-id`` label (``ses_...``).
        pod: pod name; node: ``spec.nodeName``; phase: ``status.phase``; image: the container's image.
        owner: the GShareSession's ``spec.owner`` ("" when the object is gone).
        gpus: ``nvidia.com/gpu`` of the limits; memory_mib / cores: ``nvidia.com/gpumem`` / ``gpucores`` (None: whole GPUs).
        devices: HAMi's allocation, ``[{"uuid", "type", "memory_mib", "cores"}]``.
        volumes: ``[{"name", "mount_path", "claim", "size"}]``.
    """

    session_id: str
    pod: str
    node: str
    phase: str
    image: str
    owner: str = ""
    gpus: str = ""
    memory_mib: str | None = None
    cores: str | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, str]] = field(default_factory=list)


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def pod_facts(get: Getter, namespace: str, service: str) -> PodFacts | None:
    """The facts of the Running pod behind ``service`` in ``namespace``, or None (no Service, no Running pod).

    Args:
        get: reads one apiserver path (``/api/v1/...``) as JSON, None on 404.
        namespace: the Ingress's namespace (its Service is in the same one).
        service: the Ingress backend's Service name.
    """
    svc = get(f"/api/v1/namespaces/{namespace}/services/{service}")
    selector = ((svc or {}).get("spec") or {}).get("selector") or {}
    if not selector:
        return None
    pods = (get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={_selector(selector)}") or {}).get("items") or []
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    if not running:
        return None  # ingress-nginx: no endpoint, 503
    pod = running[0]
    meta, spec = pod["metadata"], pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    limits = (container.get("resources") or {}).get("limits") or {}
    session_id = (meta.get("labels") or {}).get(SESSION_ID_LABEL, "")
    try:
        devices = [d for c in decode_pod_devices((meta.get("annotations") or {}).get(HAMI_POD_DEVICES_ALLOCATED_ANNOTATION, "")) for d in c]
    except HamiDecodeError:
        devices = []
    gss = None
    if meta.get("ownerReferences"):
        owner_ref = meta["ownerReferences"][0]
        gss = get(f"/apis/{owner_ref['apiVersion']}/namespaces/{namespace}/gsharesessions/{owner_ref['name']}")
    gss_spec = (gss or {}).get("spec") or {}
    sizes = {v.get("claimName"): v.get("size", "") for v in gss_spec.get("volumes") or []}
    claims = {v["name"]: (v.get("persistentVolumeClaim") or {}).get("claimName", "") for v in spec.get("volumes") or []}
    volumes = [
        {"name": m["name"].removeprefix("vol-"), "mount_path": m.get("mountPath", ""), "claim": claims.get(m["name"], ""),
         "size": sizes.get(claims.get(m["name"], ""), "")}
        for m in container.get("volumeMounts") or [] if m["name"] in claims
    ]
    return PodFacts(
        session_id=session_id, pod=meta["name"], node=spec.get("nodeName", ""), phase=pod["status"]["phase"],
        image=container.get("image", ""), owner=gss_spec.get("owner", ""), gpus=limits.get("nvidia.com/gpu", ""),
        memory_mib=limits.get("nvidia.com/gpumem"), cores=limits.get("nvidia.com/gpucores"), devices=devices, volumes=volumes,
    )


_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;margin:0;background:#f5f6f8;color:#1d2330}
header{background:#1d2330;color:#fff;padding:14px 24px}header small{opacity:.7}
main{max-width:860px;margin:24px auto;padding:0 24px}
section{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:16px 20px;margin-bottom:16px}
h1{font-size:20px;margin:0}h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:4px 8px;border-top:1px solid #eef0f3;vertical-align:top}
code{font:13px ui-monospace,monospace;background:#eef0f3;padding:1px 4px;border-radius:3px}
.muted{color:#667085}
"""


def render(facts: PodFacts, *, path: str, user: str) -> str:
    """The page (HTML) for ``facts``, as served at ``path`` (no query) to ``user`` (``X-Auth-Request-User``)."""
    e = html.escape
    share = ""
    if facts.memory_mib or facts.cores:
        share = f" (share: {e(facts.memory_mib or 'all')} MiB, {e(facts.cores or '100')}% cores each)"
    devices = "".join(
        f"<tr><td><code>{e(d['uuid'])}</code></td><td>{e(d['type'])}</td><td>{d['memory_mib']} MiB</td>"
        f"<td>{d['cores'] or 100}%</td></tr>" for d in facts.devices
    ) or '<tr><td colspan="4" class="muted">No HAMi allocation on the pod.</td></tr>'
    volumes = "".join(
        f"<tr><td>{e(v['name'])}</td><td><code>{e(v['mount_path'])}</code></td><td><code>{e(v['claim'])}</code></td>"
        f"<td>{e(v['size'])}</td></tr>" for v in facts.volumes
    ) or '<tr><td colspan="4" class="muted">No volumes mounted.</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(facts.session_id)} · gShare demo session</title>
<style>{_STYLE}</style></head>
<body data-session-id="{e(facts.session_id)}">
<header><h1>Session <span id="session-id">{e(facts.session_id)}</span></h1>
<small>The demo's stand-in for the session pod (the real image serves JupyterLab here).</small></header>
<main>
<section><h2>Session</h2><table>
<tr><th>Session</th><td><code>{e(facts.session_id)}</code></td></tr>
<tr><th>Signed in as</th><td id="user">{e(user) or '<span class="muted">(no X-Auth-Request-User)</span>'}</td></tr>
<tr><th>Owner</th><td>{e(facts.owner)}</td></tr>
<tr><th>Pod</th><td><code>{e(facts.pod)}</code> ({e(facts.phase)})</td></tr>
<tr><th>Node</th><td id="node">{e(facts.node)}</td></tr>
<tr><th>Image</th><td><code>{e(facts.image)}</code></td></tr>
<tr><th>Path</th><td><code>{e(path)}</code></td></tr>
</table></section>
<section><h2>GPUs: {e(facts.gpus)}{share}</h2><table>
<tr><th>UUID</th><th>Type</th><th>Memory</th><th>Cores</th></tr>{devices}</table></section>
<section><h2>Volumes mounted</h2><table>
<tr><th>Volume</th><th>Mounted at</th><th>PVC</th><th>Size</th></tr>{volumes}</table></section>
</main></body></html>
"""
