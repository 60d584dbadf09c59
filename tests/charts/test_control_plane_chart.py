"""charts/gshare: workloads, Ingresses, the migration Job, Secrets and required values, read from rendered output."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.core.management import get_commands
from django.urls import resolve

import core.home
import gshare.embedded
import gshare.settings
from tests.charts.rendering import (
    CONTROL_PLANE_CHART,
    CONTROL_PLANE_FULL_VALUES,
    CONTROL_PLANE_VALUES,
    PROXY_CONTAINER,
    application_containers,
    chart_defaults,
    chart_metadata,
    containers,
    env_of,
    expect_render_error,
    merged,
    of_kind,
    pod_specs,
    render_control_plane,
    without,
    workload,
)

SOURCE_RANGE_ANNOTATION = "nginx.ingress.kubernetes.io/whitelist-source-range"
UPSTREAM_VHOST_ANNOTATION = "nginx.ingress.kubernetes.io/upstream-vhost"
INTERNAL_PATHS = {"/internal", "/.well-known"}

#: The control plane's secret settings and the values naming the Secret each one comes from.
SECRET_SETTINGS = {
    "DATABASE_URL": "database",
    "REDIS_URL": "redis",
    "DJANGO_SECRET_KEY": "django",
    "GSHARE_ENCRYPTION_KEYS": "encryption",
}

#: A URL that carries a password (scheme://user:password@host): never a plain environment value.
URL_WITH_CREDENTIALS = re.compile(r"://[^/@\s]*:[^/@\s]*@")

INTERNAL_PLANE = {"ingress": {"internalPlane": {"enabled": True, "sourceRange": "10.20.0.0/16,192.0.2.4/32"}}}

#: The api Service's in-cluster names (release gshare, namespace gshare): always internal hosts.
SERVICE_HOSTS = ["gshare-api", "gshare-api.gshare", "gshare-api.gshare.svc", "gshare-api.gshare.svc.cluster.local"]


def api_service(objects) -> dict:
    """The Service whose selector picks the api Deployment's pods."""
    pod_labels = workload(objects, "api")["spec"]["template"]["metadata"]["labels"]
    matching = [s for s in of_kind(objects, "Service") if s["spec"]["selector"].items() <= pod_labels.items()]
    assert len(matching) == 1
    return matching[0]


def ingress_routes(ingress: dict) -> list[tuple[str, str, str, str]]:
    """``(host, path, pathType, backend service)`` of every path of an Ingress."""
    return [
        (rule.get("host"), path["path"], path["pathType"], path["backend"]["service"]["name"])
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]


def ext_authz_ingresses(objects) -> list[dict]:
    """The host-less Ingress of Envoy's ext_authz check (``ingress-ext-authz.yaml``), judged by its own tests."""
    return [i for i in of_kind(objects, "Ingress") if i["metadata"]["name"].endswith("-ext-authz")]


def internal_ingresses(objects) -> list[dict]:
    return [i for i in of_kind(objects, "Ingress")
            if SOURCE_RANGE_ANNOTATION in (i["metadata"].get("annotations") or {}) and i not in ext_authz_ingresses(objects)]


def public_ingresses(objects) -> list[dict]:
    return [i for i in of_kind(objects, "Ingress") if i not in internal_ingresses(objects) and i not in ext_authz_ingresses(objects)]


def backend_port_exists(ingress: dict, service: dict) -> bool:
    ports = {p["name"] for p in service["spec"]["ports"]} | {p["port"] for p in service["spec"]["ports"]}
    return all(
        (path["backend"]["service"]["port"].get("name") or path["backend"]["service"]["port"].get("number")) in ports
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    )


# --------------------------------------------------------------------------- workloads


def test_the_four_components():
    objects = render_control_plane()
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"]: w["kind"] for w, _ in pod_specs(objects)} == {
        "api": "Deployment", "worker": "Deployment", "beat": "Deployment", "migrate": "Job",
    }


def test_api_worker_and_beat_run_the_documented_commands():
    objects = render_control_plane()
    commands = {c["name"]: c["command"] for _, c in containers(objects)}
    assert commands["api"][:2] == ["gunicorn", "gshare.wsgi"]
    assert commands["worker"][:4] == ["celery", "-A", "gshare", "worker"]
    assert commands["beat"][:4] == ["celery", "-A", "gshare", "beat"]
    assert "--scheduler=django_celery_beat.schedulers:DatabaseScheduler" in commands["beat"]


@pytest.mark.parametrize("values", [CONTROL_PLANE_VALUES, CONTROL_PLANE_FULL_VALUES, merged(CONTROL_PLANE_VALUES, {"beat": {"replicas": 3}})],
                         ids=["minimal", "full", "beat-replicas-ignored"])
def test_beat_is_exactly_one_replica_replaced_with_recreate(values):
    beat = workload(render_control_plane(values), "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


def test_replicas_and_resources_follow_values():
    values = CONTROL_PLANE_FULL_VALUES
    objects = render_control_plane(merged(values, {"worker": {"resources": {"limits": {"memory": "2Gi"}}}}))
    assert workload(objects, "api")["spec"]["replicas"] == values["api"]["replicas"]
    assert workload(objects, "worker")["spec"]["replicas"] == values["worker"]["replicas"]
    worker = workload(objects, "worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["memory"] == "2Gi"
    assert f"--concurrency={values['worker']['concurrency']}" in worker["command"]


def test_api_probes_use_healthz_on_the_container_port():
    """On the proxy's port: a probe passes through nginx to gunicorn, so it answers only when both do."""
    pod = workload(render_control_plane(), "api")["spec"]["template"]["spec"]
    api = pod["containers"][0]
    port_names = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = api[probe]["httpGet"]
        assert get["port"] in port_names
        assert resolve(get["path"]).func.__name__ == "healthz"


@pytest.mark.parametrize("values", [CONTROL_PLANE_VALUES, CONTROL_PLANE_FULL_VALUES], ids=["minimal", "full"])
def test_pod_security(values):
    for workload_obj, spec in pod_specs(render_control_plane(values)):
        where = workload_obj["metadata"]["name"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532, where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert spec["automountServiceAccountToken"] is False, where
        tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert ctx.get("privileged") is not True, where
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert len(tmp) == 1 and tmp[0]["name"] in tmp_volumes, f"{where}/{container['name']}: no emptyDir at /tmp"
            assert container["name"] == PROXY_CONTAINER or env_of(container)["GSHARE_HOME"]["value"].startswith("/tmp/"), where


def test_image_defaults_to_the_chart_app_version_and_follows_values():
    defaults = chart_defaults(CONTROL_PLANE_CHART)["image"]
    app_version = chart_metadata(CONTROL_PLANE_CHART)["appVersion"]
    assert {c["image"] for _, c in containers(render_control_plane())} == {f"{defaults['repository']}:{app_version}"}
    custom = CONTROL_PLANE_FULL_VALUES["image"]
    for _, container in containers(render_control_plane(CONTROL_PLANE_FULL_VALUES)):
        assert container["image"] == f"{custom['repository']}:{custom['tag']}"
        assert container["imagePullPolicy"] == custom["pullPolicy"]


# --------------------------------------------------------------------------- environment and Secrets


@pytest.mark.parametrize("values", [CONTROL_PLANE_VALUES, CONTROL_PLANE_FULL_VALUES], ids=["minimal", "full"])
def test_secret_settings_come_only_from_the_named_secret_keys(values):
    defaults = chart_defaults(CONTROL_PLANE_CHART)
    for workload_obj, container in application_containers(render_control_plane(values)):
        where = f"{workload_obj['metadata']['name']}/{container['name']}"
        env = env_of(container)
        for setting, key in SECRET_SETTINGS.items():
            ref = merged(defaults[key], values[key])
            assert env[setting] == {"name": setting, "valueFrom": {"secretKeyRef": {"name": ref["existingSecret"], "key": ref["secretKey"]}}}, where


@pytest.mark.parametrize("values", [CONTROL_PLANE_VALUES, CONTROL_PLANE_FULL_VALUES], ids=["minimal", "full"])
def test_no_secret_reaches_a_container_except_through_secret_key_ref(values):
    """No envFrom (which would pour a whole Secret into the environment); every valueFrom that reads a Secret
    is a secretKeyRef; no plain value is a secret setting or a URL with credentials."""
    for workload_obj, container in application_containers(render_control_plane(values)):
        where = f"{workload_obj['metadata']['name']}/{container['name']}"
        assert "envFrom" not in container, where
        for entry in container.get("env", []):
            if "valueFrom" in entry:
                assert set(entry["valueFrom"]) <= {"secretKeyRef", "fieldRef"}, f"{where}: {entry['name']}"
            else:
                assert entry["name"] not in SECRET_SETTINGS, f"{where}: {entry['name']} as a plain value"
                assert not URL_WITH_CREDENTIALS.search(entry["value"]), f"{where}: {entry['name']}"


@pytest.mark.parametrize("setting", sorted(SECRET_SETTINGS))
def test_a_secret_setting_is_refused_as_a_plain_value(setting):
    message = expect_render_error(render_control_plane, merged(CONTROL_PLANE_VALUES, {"settings": {setting: "postgres://u:p@h/db"}}))
    assert f"settings.{setting} is refused" in message and "existingSecret" in message


def test_a_setting_the_chart_sets_itself_is_refused_in_settings_and_extra_env():
    """Every name appears once per container (server-side apply refuses duplicate list keys)."""
    chart_set = [e["name"] for e in workload(render_control_plane(), "api")["spec"]["template"]["spec"]["containers"][0]["env"]]
    for name in set(chart_set) - set(SECRET_SETTINGS):
        message = expect_render_error(render_control_plane, merged(CONTROL_PLANE_VALUES, {"settings": {name: "x"}}))
        assert f"settings.{name} is refused: the chart sets {name} itself" in message
    values = merged(CONTROL_PLANE_VALUES, {"settings": {"GSHARE_PLACEMENT_POLICY": "spread"},
                                          "extraEnv": [{"name": "GSHARE_PLACEMENT_POLICY", "value": "binpack"}]})
    assert "extraEnv entry GSHARE_PLACEMENT_POLICY is refused" in expect_render_error(render_control_plane, values)


def test_every_environment_variable_is_a_setting_the_control_plane_reads():
    """Catches typos: each name the chart sets is read by gshare/settings, gshare/embedded.py or core/home.py
    (GSHARE_HOME), or is Kubernetes plumbing."""
    sources = [*Path(gshare.settings.__file__).parent.glob("*.py"), Path(gshare.embedded.__file__), Path(core.home.__file__)]
    settings_source = "\n".join(p.read_text() for p in sources)
    plumbing = {"POD_IP", "DJANGO_SETTINGS_MODULE", "PROMETHEUS_MULTIPROC_DIR"}  # the last read by prometheus-client
    names = {entry["name"] for _, c in containers(render_control_plane(CONTROL_PLANE_FULL_VALUES)) for entry in c.get("env", [])}
    unread = sorted(n for n in names - plumbing if f'"{n}"' not in settings_source)
    assert unread == []


def test_production_mode_is_on_everywhere():
    for _, container in application_containers(render_control_plane()):
        env = env_of(container)
        assert env["GSHARE_PRODUCTION"]["value"] == "true"
        assert env["DJANGO_SETTINGS_MODULE"]["value"] == "gshare.settings"


def test_plain_settings_are_passed_as_strings_to_every_component():
    values = CONTROL_PLANE_FULL_VALUES
    for _, container in application_containers(render_control_plane(values)):
        env = env_of(container)
        for name, value in values["settings"].items():
            assert env[name] == {"name": name, "value": str(value)}
        assert env["GSHARE_SESSION_NAMESPACE"]["value"] == values["sessionNamespace"]
        assert env["GSHARE_LOG_LEVEL"]["value"] == values["logLevel"]
        assert env["GSHARE_CONTROL_PLANE_URL"]["value"] == values["controlPlaneUrl"].rstrip("/")
        for extra in values["extraEnv"]:
            assert env[extra["name"]] == extra


def test_allowed_hosts_cover_both_ingresses_the_control_plane_url_and_the_pod_ip():
    values = CONTROL_PLANE_FULL_VALUES
    for _, container in application_containers(render_control_plane(values)):
        env_list = container["env"]
        env = env_of(container)
        hosts = env["DJANGO_ALLOWED_HOSTS"]["value"].split(",")
        expected = {values["ingress"]["host"], values["ingress"]["internalPlane"]["host"], urlsplit(values["controlPlaneUrl"]).hostname,
                    *values["django"]["allowedHosts"], *SERVICE_HOSTS, "$(POD_IP)"}
        assert set(hosts) == expected
        assert len(hosts) == len(set(hosts))
        # Kubernetes expands $(POD_IP) only from entries defined before it.
        names = [e["name"] for e in env_list]
        assert names.index("POD_IP") < names.index("DJANGO_ALLOWED_HOSTS")
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["DJANGO_CSRF_TRUSTED_ORIGINS"]["value"].split(",") == values["django"]["csrfTrustedOrigins"]


def internal_hosts_of(objects) -> list[str]:
    """``GSHARE_INTERNAL_HOSTS`` of the api container, split (the same in every container: checked here too)."""
    values = {env_of(c)["GSHARE_INTERNAL_HOSTS"]["value"] for _, c in application_containers(objects)}
    assert len(values) == 1
    return values.pop().split(",")


def test_internal_hosts_are_the_service_names_the_internal_plane_host_and_the_pod_ip_never_the_public_host():
    values = CONTROL_PLANE_FULL_VALUES
    objects = render_control_plane(values)
    hosts = internal_hosts_of(objects)
    assert hosts == [*SERVICE_HOSTS, values["ingress"]["internalPlane"]["host"], "$(POD_IP)"]  # controlPlaneUrl's host is the plane's
    assert values["ingress"]["host"] not in hosts
    service = api_service(objects)["metadata"]["name"]
    assert all(h == "$(POD_IP)" or h.split(".")[0] == service or h == values["ingress"]["internalPlane"]["host"] for h in hosts)
    names = [e["name"] for e in workload(objects, "api")["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.index("POD_IP") < names.index("GSHARE_INTERNAL_HOSTS")  # Kubernetes expands $(POD_IP) only from earlier entries


@pytest.mark.parametrize("values", [
    CONTROL_PLANE_VALUES,
    merged(CONTROL_PLANE_VALUES, {"ingress": {"internalPlane": {"enabled": False, "sourceRange": "10.0.0.0/8", "host": "internal.example.com"}}}),
], ids=["default", "disabled-with-values"])
def test_without_the_internal_plane_only_in_cluster_names_and_the_control_plane_url_host_are_internal(values):
    hosts = internal_hosts_of(render_control_plane(values))
    assert hosts == [*SERVICE_HOSTS, "$(POD_IP)"]  # controlPlaneUrl http://gshare-api.gshare.svc is one of them
    assert values["ingress"]["host"] not in hosts and "internal.example.com" not in hosts


def test_a_control_plane_url_of_its_own_is_an_internal_host():
    values = merged(CONTROL_PLANE_VALUES, {"controlPlaneUrl": "https://GShare-LB.corp.example.net:8443/"})
    assert internal_hosts_of(render_control_plane(values)) == [*SERVICE_HOSTS, "gshare-lb.corp.example.net", "$(POD_IP)"]


def test_the_cluster_domain_names_the_longest_service_name():
    values = merged(CONTROL_PLANE_VALUES, {"clusterDomain": "k8s.corp.example.net."})
    assert internal_hosts_of(render_control_plane(values))[3] == "gshare-api.gshare.svc.k8s.corp.example.net"


@pytest.mark.parametrize("values", [
    merged(CONTROL_PLANE_VALUES, {"controlPlaneUrl": "https://gshare.example.com"}),
    merged(CONTROL_PLANE_VALUES, {"controlPlaneUrl": "https://GSHARE.example.com:443/"}),
    merged(CONTROL_PLANE_FULL_VALUES, {"controlPlaneUrl": "https://gshare.example.com"}),
], ids=["no-internal-plane", "port-and-case", "internal-plane-on-its-own-host"])
def test_a_control_plane_url_on_the_public_host_without_the_internal_plane_there_fails(values):
    message = expect_render_error(render_control_plane, values)
    assert "is on the public host ingress.host (gshare.example.com), where /internal and /.well-known answer 404" in message
    assert "Enable ingress.internalPlane" in message


def test_the_internal_plane_on_the_public_host_through_another_class_fails():
    values = merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": {"internalPlane": {"className": "nginx-internal"}}}))
    message = expect_render_error(render_control_plane, values)
    assert "the public controller would serve /internal and /.well-known of that host without the source range" in message


def test_on_one_host_the_internal_locations_come_only_from_the_source_restricted_ingress():
    """internalPlane.host = ingress.host (the default when it is empty): the host is internal for the api, so the
    restriction is ingress-nginx's. It merges the two Ingresses of one host and class into one server; the longer
    prefixes /internal and /.well-known of the internal Ingress win over the public /, and the internal Ingress's
    whitelist-source-range annotation applies to its locations only (tests/e2e/test_internal_plane_nginx.py runs that
    configuration in a real nginx)."""
    values = merged(merged(CONTROL_PLANE_VALUES, {"controlPlaneUrl": "https://gshare.example.com"}), INTERNAL_PLANE)
    objects = render_control_plane(values)
    host = values["ingress"]["host"]
    assert host in internal_hosts_of(objects)
    [public] = public_ingresses(objects)
    [internal] = internal_ingresses(objects)
    assert public["spec"]["ingressClassName"] == internal["spec"]["ingressClassName"]  # one controller, one merged server
    assert [(h, p) for h, p, _, _ in ingress_routes(public)] == [(host, "/")]
    assert SOURCE_RANGE_ANNOTATION not in (public["metadata"].get("annotations") or {})
    assert sorted((h, p, t) for h, p, t, _ in ingress_routes(internal)) == sorted((host, p, "Prefix") for p in INTERNAL_PATHS)
    assert internal["metadata"]["annotations"][SOURCE_RANGE_ANNOTATION] == INTERNAL_PLANE["ingress"]["internalPlane"]["sourceRange"]


@pytest.mark.parametrize("pod_ip", ["10.42.1.7", "fd00:42::7"])
def test_the_control_plane_accepts_every_rendered_internal_host(settings, pod_ip):
    from core.internal_hosts import internal_hosts

    rendered = internal_hosts_of(render_control_plane(CONTROL_PLANE_FULL_VALUES))
    settings.GSHARE_INTERNAL_HOSTS = [h.replace("$(POD_IP)", pod_ip) for h in rendered]
    assert len(internal_hosts()) == len(rendered)


def test_csrf_trusted_origin_defaults_to_the_public_host_over_https():
    for _, container in application_containers(render_control_plane()):
        assert env_of(container)["DJANGO_CSRF_TRUSTED_ORIGINS"]["value"] == f"https://{CONTROL_PLANE_VALUES['ingress']['host']}"


# --------------------------------------------------------------------------- required values


@pytest.mark.parametrize("missing", [
    "controlPlaneUrl",
    "database.existingSecret",
    "redis.existingSecret",
    "django.existingSecret",
    "encryption.existingSecret",
    "ingress.host",
])
def test_a_missing_required_value_fails_with_a_message_naming_it(missing):
    message = expect_render_error(render_control_plane, without(CONTROL_PLANE_VALUES, missing))
    assert f"{missing} is required" in message


@pytest.mark.parametrize("missing", ["database.existingSecret", "encryption.existingSecret"])
def test_an_empty_secret_name_fails_like_a_missing_one(missing):
    section, key = missing.split(".")
    message = expect_render_error(render_control_plane, merged(CONTROL_PLANE_VALUES, {section: {key: ""}}))
    assert f"{missing} is required" in message and "docs/install.md" in message


def test_a_control_plane_url_that_is_not_http_fails():
    message = expect_render_error(render_control_plane, merged(CONTROL_PLANE_VALUES, {"controlPlaneUrl": "gshare.example.com"}))
    assert "controlPlaneUrl must be an http(s) URL" in message


def test_without_ingress_the_public_host_is_not_required():
    objects = render_control_plane(merged(without(CONTROL_PLANE_VALUES, "ingress.host"), {"ingress": {"enabled": False}}))
    assert of_kind(objects, "Ingress") == []


# --------------------------------------------------------------------------- Service and Ingresses


def test_the_api_service_targets_the_api_container_port():
    objects = render_control_plane()
    service = api_service(objects)
    container_ports = {p["name"] for c in workload(objects, "api")["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


@pytest.mark.parametrize("values", [CONTROL_PLANE_VALUES, CONTROL_PLANE_FULL_VALUES], ids=["minimal", "full"])
def test_public_ingress_routes_everything_on_the_public_host_to_the_api(values):
    objects = render_control_plane(values)
    service = api_service(objects)
    [ingress] = public_ingresses(objects)
    assert ingress_routes(ingress) == [(values["ingress"]["host"], "/", "Prefix", service["metadata"]["name"])]
    assert backend_port_exists(ingress, service)
    assert ingress["spec"]["ingressClassName"] == values["ingress"].get("className", chart_defaults(CONTROL_PLANE_CHART)["ingress"]["className"])
    for key, value in values["ingress"].get("annotations", {}).items():
        assert ingress["metadata"]["annotations"][key] == value
    if values["ingress"].get("tlsSecretName"):
        assert ingress["spec"]["tls"] == [{"hosts": [values["ingress"]["host"]], "secretName": values["ingress"]["tlsSecretName"]}]
    else:
        assert "tls" not in ingress["spec"]


def test_internal_plane_ingress_is_absent_by_default():
    objects = render_control_plane()
    assert internal_ingresses(objects) == []
    assert len(of_kind(objects, "Ingress")) == 1


def test_internal_plane_ingress_is_absent_when_disabled_even_with_a_source_range():
    values = merged(CONTROL_PLANE_VALUES, {"ingress": {"internalPlane": {"enabled": False, "sourceRange": "10.0.0.0/8"}}})
    assert internal_ingresses(render_control_plane(values)) == []


@pytest.mark.parametrize("values", [merged(CONTROL_PLANE_VALUES, INTERNAL_PLANE), CONTROL_PLANE_FULL_VALUES], ids=["same-host", "own-host"])
def test_internal_plane_ingress_exposes_only_internal_and_well_known_to_the_api(values):
    objects = render_control_plane(values)
    service = api_service(objects)
    plane = values["ingress"]["internalPlane"]
    [ingress] = internal_ingresses(objects)
    assert len(of_kind(objects, "Ingress")) == 2 + len(ext_authz_ingresses(objects))
    routes = ingress_routes(ingress)
    host = plane.get("host") or values["ingress"]["host"]
    assert sorted(routes) == sorted((host, path, "Prefix", service["metadata"]["name"]) for path in INTERNAL_PATHS)
    assert backend_port_exists(ingress, service)
    assert ingress["metadata"]["annotations"][SOURCE_RANGE_ANNOTATION] == plane["sourceRange"]
    default_class = chart_defaults(CONTROL_PLANE_CHART)["ingress"]["className"]
    assert ingress["spec"]["ingressClassName"] == (plane.get("className") or values["ingress"].get("className", default_class))


@pytest.mark.parametrize("body_size", ["32m", "64m", ""], ids=["default", "custom", "none"])
def test_both_ingresses_carry_the_proxy_body_size(body_size):
    annotation = "nginx.ingress.kubernetes.io/proxy-body-size"
    values = merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": {"proxyBodySize": body_size}}))
    if body_size == "32m":
        values["ingress"].pop("proxyBodySize")
        assert chart_defaults(CONTROL_PLANE_CHART)["ingress"]["proxyBodySize"] == body_size
    objects = render_control_plane(values)
    ingresses = public_ingresses(objects) + internal_ingresses(objects)
    assert len(ingresses) == 2
    for ingress in ingresses:
        assert (ingress["metadata"].get("annotations") or {}).get(annotation) == (body_size or None)


def test_the_source_range_annotation_cannot_be_overridden_through_annotations():
    values = merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": {"internalPlane": {"annotations": {SOURCE_RANGE_ANNOTATION: "0.0.0.0/0"}}}}))
    [ingress] = internal_ingresses(render_control_plane(values))
    assert ingress["metadata"]["annotations"][SOURCE_RANGE_ANNOTATION] == INTERNAL_PLANE["ingress"]["internalPlane"]["sourceRange"]


@pytest.mark.parametrize("values", [
    CONTROL_PLANE_VALUES,
    merged(CONTROL_PLANE_VALUES, INTERNAL_PLANE),
    CONTROL_PLANE_FULL_VALUES,
    merged(without(CONTROL_PLANE_VALUES, "ingress.host"),
           merged(INTERNAL_PLANE, {"ingress": {"enabled": False, "internalPlane": {"host": "internal.example.com"}}})),
], ids=["default", "one-host", "own-host", "internal-plane-only"])
def test_every_ingress_sends_the_api_its_own_host_whatever_the_client_sent(values):
    """upstream-vhost: ingress-nginx sends ``Host: <the Ingress's host>`` on each of that Ingress's locations, so the api
    judges the host nginx routed on (an absolute-form request line picks the server) and never the client's Host or
    X-Forwarded-Host (tests/e2e/test_internal_plane_nginx.py sends both through a real nginx)."""
    objects = render_control_plane(values)
    ingresses = public_ingresses(objects) + internal_ingresses(objects)
    assert ingresses
    for ingress in ingresses:
        [host] = {rule["host"] for rule in ingress["spec"]["rules"]}
        assert ingress["metadata"]["annotations"][UPSTREAM_VHOST_ANNOTATION] == host, ingress["metadata"]["name"]


@pytest.mark.parametrize(("values_key", "template"), [
    ({"annotations": {UPSTREAM_VHOST_ANNOTATION: "gshare-api.gshare.svc"}}, "ingress.annotations"),
    ({"internalPlane": {"annotations": {UPSTREAM_VHOST_ANNOTATION: "gshare-api"}}}, "ingress.internalPlane.annotations"),
], ids=["public", "internal"])
def test_another_upstream_vhost_in_annotations_fails(values_key, template):
    values = merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": values_key}))
    message = expect_render_error(render_control_plane, values)
    assert f"{template} sets {UPSTREAM_VHOST_ANNOTATION} to " in message
    assert "the chart sets it to the Ingress's own host gshare.example.com" in message and "Remove it" in message


def test_an_upstream_vhost_equal_to_the_host_is_accepted():
    host = CONTROL_PLANE_VALUES["ingress"]["host"]
    values = merged(CONTROL_PLANE_VALUES, {"ingress": {"annotations": {UPSTREAM_VHOST_ANNOTATION: host}}})
    [ingress] = of_kind(render_control_plane(values), "Ingress")
    assert ingress["metadata"]["annotations"][UPSTREAM_VHOST_ANNOTATION] == host


def test_the_forwarded_host_never_counts():
    """ingress-nginx passes the client's X-Forwarded-Host on (and with use-forwarded-headers makes it $best_http_host);
    only Host, which upstream-vhost sets, may decide the internal hosts. No settings module sets USE_X_FORWARDED_HOST
    (so Django's default, False, holds whatever the chart's values say) and the chart sets no such variable."""
    sources = "\n".join(p.read_text() for p in Path(gshare.settings.__file__).parent.glob("*.py"))
    assert "USE_X_FORWARDED_HOST" not in sources
    names = {entry["name"] for _, c in containers(render_control_plane(CONTROL_PLANE_FULL_VALUES)) for entry in c.get("env", [])}
    assert not [n for n in names if "FORWARDED" in n]


def test_internal_plane_source_range_may_be_a_list():
    cidrs = ["203.0.113.0/24", "198.51.100.7/32"]
    [ingress] = internal_ingresses(render_control_plane(merged(CONTROL_PLANE_VALUES, {"ingress": {"internalPlane": {"enabled": True, "sourceRange": cidrs}}})))
    assert ingress["metadata"]["annotations"][SOURCE_RANGE_ANNOTATION] == ",".join(cidrs)


def test_internal_plane_tls_reuses_the_public_certificate_only_on_the_public_host():
    same_host = merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": {"tlsSecretName": "public-tls"}}))
    [ingress] = internal_ingresses(render_control_plane(same_host))
    assert ingress["spec"]["tls"] == [{"hosts": [CONTROL_PLANE_VALUES["ingress"]["host"]], "secretName": "public-tls"}]
    own_host = merged(same_host, {"ingress": {"internalPlane": {"host": "internal.example.com"}}})
    [ingress] = internal_ingresses(render_control_plane(own_host))
    assert "tls" not in ingress["spec"]


def test_internal_plane_paths_cover_every_internal_route_and_nothing_public():
    """Each of the project's /internal and /.well-known routes is under one of the Ingress's prefixes; no /api route is."""
    [ingress] = internal_ingresses(render_control_plane(merged(CONTROL_PLANE_VALUES, INTERNAL_PLANE)))
    prefixes = {path for _, path, _, _ in ingress_routes(ingress)}
    for route in ("/internal/v1/inventory", "/internal/connect/verify", "/.well-known/gshare-internal-jwks.json"):
        resolve(route)  # the route exists in gshare.urls
        assert any(route == p or route.startswith(p + "/") for p in prefixes), route
    for public in ("/api/v1/clusters", "/"):
        assert not any(public == p or public.startswith(p + "/") for p in prefixes)


@pytest.mark.parametrize("source_range", ["", []], ids=["empty-string", "empty-list"])
def test_internal_plane_without_source_range_fails_with_a_clear_message(source_range):
    values = merged(CONTROL_PLANE_VALUES, {"ingress": {"internalPlane": {"enabled": True, "sourceRange": source_range}}})
    message = expect_render_error(render_control_plane, values)
    assert "ingress.internalPlane.sourceRange is required when ingress.internalPlane.enabled" in message


def test_internal_plane_without_any_host_fails():
    values = merged(without(CONTROL_PLANE_VALUES, "ingress.host"), {"ingress": {"enabled": False, **INTERNAL_PLANE["ingress"]}})
    assert "ingress.internalPlane.host (or ingress.host) is required" in expect_render_error(render_control_plane, values)


# --------------------------------------------------------------------------- migration Job


def test_migration_job_is_a_pre_install_and_pre_upgrade_hook_with_a_delete_policy():
    job = workload(render_control_plane(), "migrate")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"].split(",")
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert [c["command"] for c in spec["containers"]] == [["python", "manage.py", "migrate", "--noinput"]]
    assert "initContainers" not in spec
    assert all("signing" not in v["name"] for v in spec["volumes"])


def test_migration_job_does_not_depend_on_the_chart_service_account():
    """A pre-install hook runs before the release's own ServiceAccount exists."""
    objects = render_control_plane()
    created = {sa["metadata"]["name"] for sa in of_kind(objects, "ServiceAccount")}
    assert workload(objects, "migrate")["spec"]["template"]["spec"].get("serviceAccountName") not in created
    existing = CONTROL_PLANE_FULL_VALUES["serviceAccount"]["name"]
    objects = render_control_plane(CONTROL_PLANE_FULL_VALUES)
    assert of_kind(objects, "ServiceAccount") == []
    assert {spec.get("serviceAccountName") for _, spec in pod_specs(objects)} == {existing}


def test_migration_job_imports_the_signing_key_after_migrating_when_one_is_given():
    values = CONTROL_PLANE_FULL_VALUES
    spec = workload(render_control_plane(values), "migrate")["spec"]["template"]["spec"]
    [migrate] = spec["initContainers"]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    [importer] = spec["containers"]
    assert importer["command"][:5] == ["python", "manage.py", "import_signing_key", "--file", importer["command"][4]]
    key_file = importer["command"][4]
    [mount] = [m for m in importer["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == values["signingKey"]["existingSecret"]
    [item] = volume["secret"]["items"]
    assert item["key"] == values["signingKey"]["secretKey"]
    assert f"{mount['mountPath']}/{item['path']}" == key_file
    assert not any(m["name"] == mount["name"] for m in migrate["volumeMounts"])


def test_only_the_migration_job_mounts_the_signing_key():
    objects = render_control_plane(CONTROL_PLANE_FULL_VALUES)
    for workload_obj, spec in pod_specs(objects):
        secrets = [v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v]
        expected = [CONTROL_PLANE_FULL_VALUES["signingKey"]["existingSecret"]] if workload_obj["kind"] == "Job" else []
        assert secrets == expected, workload_obj["metadata"]["name"]


def test_the_job_commands_are_management_commands_of_the_project():
    assert "import_signing_key" in get_commands()
    assert "migrate" in get_commands()



def test_envoys_ext_authz_check_has_a_host_less_ingress_of_that_path_alone_restricted_and_without_upstream_vhost():
    """Envoy's ext_authz check carries the session's host (the original ``:authority``), which no Ingress host can name:
    one host-less rule routes ``/internal/connect/ext-authz`` alone, from the clusters' source range, with the client's
    Host passed on (the api answers only a registered session domain there, tests/e2e/test_connect_ext_authz_gunicorn.py)."""
    values = merged(CONTROL_PLANE_VALUES, INTERNAL_PLANE)
    objects = render_control_plane(values)
    [ingress] = ext_authz_ingresses(objects)
    service = api_service(objects)
    assert ingress_routes(ingress) == [(None, "/internal/connect/ext-authz", "Prefix", service["metadata"]["name"])]
    assert backend_port_exists(ingress, service)
    annotations = ingress["metadata"]["annotations"]
    assert annotations[SOURCE_RANGE_ANNOTATION] == values["ingress"]["internalPlane"]["sourceRange"]
    assert UPSTREAM_VHOST_ANNOTATION not in annotations
    assert "tls" not in ingress["spec"]  # the certificate is the internal host's, picked by the SNI Envoy sends


@pytest.mark.parametrize("values", [
    CONTROL_PLANE_VALUES, merged(CONTROL_PLANE_VALUES, merged(INTERNAL_PLANE, {"ingress": {"internalPlane": {"extAuthzAnyHost": False}}})),
], ids=["no-internal-plane", "disabled"])
def test_without_the_internal_plane_or_when_disabled_there_is_no_ext_authz_ingress(values):
    assert ext_authz_ingresses(render_control_plane(values)) == []
