"""Step 5 of ``attach_cluster``: how session requests enter the cluster and reach its pods (``--routing``).

- ``gateway-api`` (the default): Envoy Gateway from its chart (``releases.envoy_gateway_release``), a GatewayClass of
  its controller, and the Gateway the session HTTPRoutes attach to (``contract.GATEWAY_NAME_DEFAULT`` in
  ``contract.GATEWAY_NAMESPACE_DEFAULT`` unless ``--gateway``), with an HTTPS listener for the session domain; the step
  ends when the Gateway is ``Programmed``.
- ``ingress-nginx``: the ingress-nginx chart as before. ingress-nginx is retired upstream: no releases or security
  patches since 2026-03-24 (Kubernetes SIG Network and the Security Response Committee), so the step says so.
- ``--skip-ingress``: nothing is installed; the step finds which controller the cluster runs (an IngressClass of
  ``k8s.io/ingress-nginx``, an Accepted GatewayClass of Envoy Gateway) and uses it, or stops with the commands that
  install one.

The objects are plain manifests built here (Gateway API v1.6.1 ``gateway.networking.k8s.io/v1``), applied with the
admin kubeconfig as field manager ``gshare-control-plane``. A Gateway the attach did not create (no
``app.kubernetes.io/managed-by: gshare`` label) is used as it is, never rewritten.
"""

from __future__ import annotations

import base64
import datetime
import re
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.conf import settings

from attach import releases
from attach.context import StepContext
from attach.fixes import rerun_with
from contract import GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT, ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX
from kube import KubeGateway, KubeRefused
from kube.gateway import GATEWAY_CLASSES, GATEWAYS, INGRESS_CLASSES, SECRETS

TITLE = "session routing"
#: ``IngressClass.spec.controller`` of ingress-nginx.
INGRESS_NGINX_CONTROLLER = "k8s.io/ingress-nginx"
#: The GatewayClass the attach creates for Envoy Gateway (cluster-scoped; Envoy Gateway's defaults in its config).
GATEWAY_CLASS_NAME = "gshare-envoy-gateway"
#: The certificate Secret of the Gateway's HTTPS listener, in the Gateway's namespace.
TLS_SECRET_NAME = "gshare-sessions-tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gshare"}
#: Annotation of a TLS Secret the attach generated (self-signed, like ingress-nginx's default certificate): its host.
SELF_SIGNED_ANNOTATION = "gshare.io/self-signed-for"
SELF_SIGNED_DAYS = 365
RETIREMENT_WARNING = (
    "WARNING: ingress-nginx is retired upstream: no releases and no security patches since 2026-03-24 (Kubernetes SIG "
    "Network and the Security Response Committee). Move this cluster to Gateway API routing (Envoy Gateway): re-run "
    "the attach with --routing gateway-api (docs/attach.md#routing)."
)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_GATEWAY_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def parse_gateway_flag(value: str) -> tuple[str, str]:
    """``--gateway NAMESPACE/NAME`` -> ``(namespace, name)``; "" -> the defaults of ``contract``.

    Raises:
        ValueError: not ``NAMESPACE/NAME`` with a DNS label namespace and a DNS subdomain name; the message says so.
    """
    if not value:
        return GATEWAY_NAMESPACE_DEFAULT, GATEWAY_NAME_DEFAULT
    namespace, slash, name = value.partition("/")
    if not slash or not _NAME.fullmatch(namespace) or not _GATEWAY_NAME.fullmatch(name):
        raise ValueError(f"--gateway {value!r} is not NAMESPACE/NAME (lowercase DNS names, e.g. "
                         f"{GATEWAY_NAMESPACE_DEFAULT}/{GATEWAY_NAME_DEFAULT})")
    return namespace, name


def condition(obj: dict | None, kind: str) -> dict:
    """The ``status.conditions`` entry of type ``kind`` of ``obj`` (``{}`` when absent)."""
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if isinstance(entry, dict) and entry.get("type") == kind:
            return entry
    return {}


def is_true(obj: dict | None, kind: str) -> bool:
    """Whether ``obj``'s condition ``kind`` is ``True`` for its current generation (an ``observedGeneration`` older
    than ``metadata.generation`` is a verdict on an earlier spec)."""
    found = condition(obj, kind)
    generation = ((obj or {}).get("metadata") or {}).get("generation")
    observed = found.get("observedGeneration")
    return found.get("status") == "True" and (generation is None or observed is None or observed >= generation)


def gateway_class_manifest(name: str = GATEWAY_CLASS_NAME) -> dict[str, Any]:
    """The GatewayClass of Envoy Gateway's controller (``gateway.networking.k8s.io/v1``); no ``parametersRef``: the
    Envoy placement is the controller's default ``envoyProxy`` (``releases.envoy_proxy_defaults``)."""
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "spec": {"controllerName": releases.ENVOY_GATEWAY_CONTROLLER,
                     "description": "gShare session routing (Envoy Gateway, by attach_cluster)"}}


def gateway_manifest(*, name: str, namespace: str, gateway_class: str, session_domain: str, session_namespace: str,
                     tls_secret: str = TLS_SECRET_NAME) -> dict[str, Any]:
    """The Gateway session HTTPRoutes attach to (``gateway.networking.k8s.io/v1``, Gateway API v1.6.1 standard channel).

    One listener ``https``: port 443, ``hostname`` the session domain, TLS terminated with the Secret ``tls_secret`` of
    the Gateway's namespace, HTTPRoutes admitted only from ``session_namespace`` (selected by its
    ``kubernetes.io/metadata.name`` label, which the apiserver sets on every namespace).

    Returns:
        The manifest, labelled ``app.kubernetes.io/managed-by: gshare`` (the attach rewrites only Gateways it made).
    """
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": {
            "gatewayClassName": gateway_class,
            "listeners": [{
                "name": "https", "protocol": "HTTPS", "port": 443, "hostname": session_domain,
                "tls": {"mode": "Terminate", "certificateRefs": [{"group": "", "kind": "Secret", "name": tls_secret}]},
                "allowedRoutes": {
                    "namespaces": {"from": "Selector",
                                   "selector": {"matchLabels": {"kubernetes.io/metadata.name": session_namespace}}},
                    "kinds": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}],
                },
            }],
        },
    }


def self_signed_tls_secret(*, name: str, namespace: str, host: str, days: int = SELF_SIGNED_DAYS) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret with a new self-signed certificate for ``host`` (ECDSA P-256, ``days`` valid).

    The stand-in until a real certificate is put in the Secret, as ingress-nginx serves its own self-signed default
    certificate for an Ingress without TLS; annotated ``gshare.io/self-signed-for: <host>``.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY),
                     "annotations": {SELF_SIGNED_ANNOTATION: host}},
        "data": {"tls.crt": b64(cert.public_bytes(serialization.Encoding.PEM)),
                 "tls.key": b64(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))},
    }


@dataclass
class Controllers:
    """What routing controllers a cluster runs.

    Attributes:
        ingress_classes: names of IngressClasses whose controller is ``k8s.io/ingress-nginx``.
        gateway_classes: names of GatewayClasses of Envoy Gateway's controller that are ``Accepted``.
        pending_gateway_classes: names of GatewayClasses of Envoy Gateway's controller not (yet) ``Accepted``.
    """

    ingress_classes: list[str] = field(default_factory=list)
    gateway_classes: list[str] = field(default_factory=list)
    pending_gateway_classes: list[str] = field(default_factory=list)


def _list_or_none(kube: KubeGateway, resource) -> list[dict]:
    """The objects of ``resource``; ``[]`` when the cluster does not serve it (404: its CRD is not installed)."""
    try:
        return kube.list(resource)
    except KubeRefused as exc:
        if exc.status == 404:
            return []
        raise


def find_controllers(kube: KubeGateway) -> Controllers:
    """Read the cluster's IngressClasses and GatewayClasses (see :class:`Controllers`)."""
    found = Controllers()
    for ingress_class in _list_or_none(kube, INGRESS_CLASSES):
        if (ingress_class.get("spec") or {}).get("controller") == INGRESS_NGINX_CONTROLLER:
            found.ingress_classes.append(ingress_class["metadata"]["name"])
    for gateway_class in _list_or_none(kube, GATEWAY_CLASSES):
        if (gateway_class.get("spec") or {}).get("controllerName") != releases.ENVOY_GATEWAY_CONTROLLER:
            continue
        accepted = is_true(gateway_class, "Accepted")
        (found.gateway_classes if accepted else found.pending_gateway_classes).append(gateway_class["metadata"]["name"])
    return found


def run(ctx: StepContext) -> str:
    """Install (or, with ``--skip-ingress``, find) the routing controller; see the module docstring.

    Sets ``state.routing`` (``gateway-api`` or ``ingress-nginx``) and, for gateway-api, ``state.gateway_namespace``
    and ``state.gateway_name``: what registration sends.

    Raises:
        AttachStopped: no usable controller found (``--skip-ingress``), Helm failed, or the Gateway is not Programmed.
    """
    options, state = ctx.options, ctx.state
    state.gateway_namespace, state.gateway_name = parse_gateway_flag(options.gateway)
    with ctx.kube() as kube:
        if options.skip_ingress:
            state.routing, found = _detected_routing(ctx, kube)
            if state.routing == ROUTING_INGRESS_NGINX:
                ctx.echo(RETIREMENT_WARNING)
                return "skipped (--skip-ingress): ingress-nginx found (IngressClass " + ", ".join(found.ingress_classes) + ")"
            classes = found.gateway_classes
            gateway_class = GATEWAY_CLASS_NAME if GATEWAY_CLASS_NAME in classes else classes[0]
            done = _gateway(ctx, kube, gateway_class)
            return f"skipped install (--skip-ingress): Envoy Gateway found (GatewayClass {', '.join(classes)}); {done}"
        state.routing = options.routing or ROUTING_GATEWAY_API
        if not options.routing:
            found = find_controllers(kube)
            if found.ingress_classes and not found.gateway_classes:
                # A re-run (to roll the operator forward) must not move a cluster off ingress-nginx by surprise:
                # both would want port 443 of the ingress node. Moving is asked for with --routing gateway-api.
                state.routing = ROUTING_INGRESS_NGINX
                ctx.echo(RETIREMENT_WARNING)
                kept = f"ingress-nginx kept (the cluster runs it: IngressClass {', '.join(found.ingress_classes)}; --routing gateway-api moves it)"
                if not _ingress_nginx_is_ours(kube, found):
                    return f"ok: {kept}"
                return f"ok: {kept}; " + ctx.install(releases.ingress_nginx_release(options.ingress_node))
        if state.routing == ROUTING_INGRESS_NGINX:
            ctx.echo(RETIREMENT_WARNING)
            return "ok: " + ctx.install(releases.ingress_nginx_release(options.ingress_node))
        installed = ctx.install(releases.envoy_gateway_release(options.ingress_node))
        kube.apply(gateway_class_manifest())
        return f"ok: {installed}; GatewayClass {GATEWAY_CLASS_NAME}; {_gateway(ctx, kube, GATEWAY_CLASS_NAME)}"


def _ingress_nginx_is_ours(kube: KubeGateway, found: Controllers) -> bool:
    """Whether an IngressClass of ingress-nginx belongs to the Helm release the attach installs (``ingress-nginx`` in
    namespace ``ingress-nginx``): then a re-run upgrades that release as before; another installation is left alone."""
    for name in found.ingress_classes:
        annotations = ((kube.get(INGRESS_CLASSES, name, missing_ok=True) or {}).get("metadata") or {}).get("annotations") or {}
        if (annotations.get("meta.helm.sh/release-name"), annotations.get("meta.helm.sh/release-namespace")) == (
                "ingress-nginx", "ingress-nginx"):
            return True
    return False


# ----------------------------------------------------------------- --skip-ingress

def _detected_routing(ctx: StepContext, kube: KubeGateway) -> tuple[str, Controllers]:
    """The routing mode of the controller the cluster runs (``--routing``, when given, must be the one found), and the
    controllers found."""
    found = find_controllers(kube)
    wanted = ctx.options.routing
    has_nginx, has_envoy = bool(found.ingress_classes), bool(found.gateway_classes)
    install = _install_commands(ctx)
    if wanted == ROUTING_INGRESS_NGINX and not has_nginx:
        raise ctx.stop("--skip-ingress --routing ingress-nginx: the cluster has no IngressClass of controller "
                       f"{INGRESS_NGINX_CONTROLLER}",
                       f"let the attach install Gateway API routing instead (recommended): {install[ROUTING_GATEWAY_API]}\n"
                       f"or install ingress-nginx: {install[ROUTING_INGRESS_NGINX]}")
    if wanted == ROUTING_GATEWAY_API and not has_envoy:
        raise ctx.stop(_no_envoy_problem(found), f"let the attach install Envoy Gateway: {install[ROUTING_GATEWAY_API]}")
    if wanted:
        return wanted, found
    if has_nginx and has_envoy:
        raise ctx.stop(f"--skip-ingress: the cluster runs both ingress-nginx (IngressClass {', '.join(found.ingress_classes)}) "
                       f"and Envoy Gateway (GatewayClass {', '.join(found.gateway_classes)}); say which one serves sessions",
                       f"{rerun_with(ctx.options.argv, '--routing', ROUTING_GATEWAY_API)}\nor (ingress-nginx is retired upstream): "
                       f"{rerun_with(ctx.options.argv, '--routing', ROUTING_INGRESS_NGINX)}")
    if has_envoy:
        return ROUTING_GATEWAY_API, found
    if has_nginx:
        return ROUTING_INGRESS_NGINX, found
    raise ctx.stop(f"--skip-ingress: the cluster runs no routing controller gShare uses ({_no_envoy_problem(found)}; "
                   f"no IngressClass of controller {INGRESS_NGINX_CONTROLLER})",
                   f"let the attach install Envoy Gateway (Gateway API routing): {install[ROUTING_GATEWAY_API]}\n"
                   f"or install it yourself: helm install {releases.ENVOY_GATEWAY_RELEASE} "
                   f"oci://docker.io/envoyproxy/gateway-helm --version {settings.GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION} "
                   f"-n {releases.ENVOY_GATEWAY_NAMESPACE} --create-namespace --set config.envoyGateway.extensionApis.enableBackend=true\n"
                   f"kubectl apply -f - <<'YAML'\n{_yaml(gateway_class_manifest())}YAML")


def _no_envoy_problem(found: Controllers) -> str:
    if found.pending_gateway_classes:
        return (f"the GatewayClass {', '.join(found.pending_gateway_classes)} of Envoy Gateway is not Accepted (is Envoy "
                f"Gateway running? kubectl -n {releases.ENVOY_GATEWAY_NAMESPACE} get deploy envoy-gateway)")
    return f"no GatewayClass of controller {releases.ENVOY_GATEWAY_CONTROLLER}"


def _install_commands(ctx: StepContext) -> dict[str, str]:
    """The command that installs each mode's controller: this attach without ``--skip-ingress``, with ``--routing``."""
    argv = [part for part in ctx.options.argv if part != "--skip-ingress"]
    if not argv:
        return {routing: f"the same attach_cluster command without --skip-ingress, with --routing {routing}"
                for routing in (ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX)}
    return {routing: rerun_with(argv, "--routing", routing) for routing in (ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX)}


# ----------------------------------------------------------------- the Gateway

def _gateway(ctx: StepContext, kube: KubeGateway, gateway_class: str) -> str:
    """Make sure the Gateway exists (created, or re-applied when the attach manages it) and wait until it is
    ``Programmed``; returns the step's phrase about it."""
    state, options = ctx.state, ctx.options
    namespace, name = state.gateway_namespace, state.gateway_name
    if namespace == releases.operator_namespace():
        ctx.ensure_namespace(kube, namespace)
    else:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, exists_ok=True)
    current = kube.get(GATEWAYS, name, namespace=namespace, missing_ok=True)
    managed = current is None or ((current.get("metadata") or {}).get("labels") or {}).get(
        "app.kubernetes.io/managed-by") == MANAGED_BY["app.kubernetes.io/managed-by"]
    if managed:
        tls = _ensure_tls_secret(ctx, kube, namespace)
        kube.apply(gateway_manifest(name=name, namespace=namespace, gateway_class=gateway_class,
                                    session_domain=options.session_domain,
                                    session_namespace=settings.GSHARE_SESSION_NAMESPACE))
        said = f"Gateway {namespace}/{name} {'created' if current is None else 'applied'} ({tls})"
    else:
        said = f"Gateway {namespace}/{name} found (not gShare's: used as it is)"
    address = _wait_programmed(ctx, kube, namespace, name, gateway_class)
    return f"{said}, Programmed" + (f" at {address}" if address else "")


def _ensure_tls_secret(ctx: StepContext, kube: KubeGateway, namespace: str) -> str:
    """The listener's certificate Secret: kept when present (a real certificate put there, or ours for this host);
    a new self-signed one when missing or when ours was made for another session domain."""
    host = ctx.options.session_domain
    current = kube.get(SECRETS, TLS_SECRET_NAME, namespace=namespace, missing_ok=True)
    if current is not None:
        made_for = ((current.get("metadata") or {}).get("annotations") or {}).get(SELF_SIGNED_ANNOTATION)
        if made_for is None:
            return f"certificate Secret {TLS_SECRET_NAME} kept"
        if made_for == host:
            return f"self-signed certificate Secret {TLS_SECRET_NAME} kept (put a real one there: docs/attach.md#routing)"
        kube.delete(SECRETS, TLS_SECRET_NAME, namespace=namespace)
    kube.create(self_signed_tls_secret(name=TLS_SECRET_NAME, namespace=namespace, host=host))
    return f"self-signed certificate Secret {TLS_SECRET_NAME} for {host} created (put a real one there: docs/attach.md#routing)"


def _wait_programmed(ctx: StepContext, kube: KubeGateway, namespace: str, name: str, gateway_class: str) -> str:
    """Poll the Gateway until ``Programmed`` is True for its generation; returns its first address ("" if none).

    Raises:
        AttachStopped: not Programmed within ``GSHARE_ATTACH_GATEWAY_TIMEOUT`` seconds; the problem quotes the
            Gateway's (and an un-Accepted GatewayClass's) condition.
    """
    timeout = settings.GSHARE_ATTACH_GATEWAY_TIMEOUT
    deadline = time.monotonic() + timeout
    while True:
        gateway = kube.get(GATEWAYS, name, namespace=namespace, missing_ok=True)
        if is_true(gateway, "Programmed"):
            addresses = (gateway.get("status") or {}).get("addresses") or []
            return str((addresses[0] or {}).get("value") or "") if addresses and isinstance(addresses[0], dict) else ""
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    programmed = condition(gateway, "Programmed")
    said = (f"{programmed.get('status')}, reason {programmed.get('reason')}: {programmed.get('message')}" if programmed
            else "no status: no controller has looked at it")
    gateway_class_obj = kube.get(GATEWAY_CLASSES, gateway_class, missing_ok=True)
    class_said = "" if is_true(gateway_class_obj, "Accepted") else f"; its GatewayClass {gateway_class} is not Accepted"
    namespace_eg = releases.ENVOY_GATEWAY_NAMESPACE
    fix = (f"see why: kubectl -n {namespace} describe gateway {name}; kubectl -n {namespace_eg} get deploy,pods; "
           f"kubectl -n {namespace_eg} logs deploy/envoy-gateway")
    if programmed.get("reason") == "AddressNotAssigned" and ctx.options.skip_ingress:
        # Envoy Gateway's defaults put Envoy behind a LoadBalancer Service, which nothing serves on bare metal.
        fix += ("\nEnvoy's LoadBalancer Service got no address: let the attach configure Envoy Gateway to run Envoy on "
                f"--ingress-node {ctx.options.ingress_node}'s host network: {_install_commands(ctx)[ROUTING_GATEWAY_API]}")
    else:
        fix += f"\n(Envoy runs on --ingress-node {ctx.options.ingress_node} on the host network: port 443 there must be free)"
    raise ctx.stop(f"the Gateway {namespace}/{name} is not Programmed after {timeout:.0f} s (Programmed: {said}){class_said}", fix)


def _yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False)
