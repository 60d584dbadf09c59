"""``attach_cluster`` step 5, session routing, against an emulated cluster: what ``--skip-ingress`` finds, a Gateway that
is never programmed, and moving from a cluster's own Envoy Gateway to the attach's.

The charts come from the loopback chart repository (``demo/data/charts``) through the real Helm engine; Envoy
Gateway's status is written by the emulator's stand-in controller (``demo/emulator/controllers/envoy_gateway.py``).
"""

from __future__ import annotations

import time

import pytest

from attach.helm import install_release
from attach.releases import ChartRelease
from clusters.models import Cluster
from tests.attach.test_attach_cluster import RETIREMENT, attach, fix_of, helm_releases

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

EG_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
GATEWAY_GROUP = "gateway.networking.k8s.io"


def install_envoy_gateway_as_its_guide_does(emulated, kubeconfig_path, chart_repo, *, accepted_class: str | None = "eg"):
    """``helm install eg oci://docker.io/envoyproxy/gateway-helm --version v1.9.0 -n envoy-gateway-system`` with the
    chart's own values (Envoy behind a LoadBalancer Service), then the guide's GatewayClass ``eg``; waits until the
    stand-in controller has Accepted it. ``accepted_class`` None: only the chart's CRDs, a GatewayClass of Envoy
    Gateway's controller and no controller running (its Deployment deleted)."""
    release = ChartRelease(release="eg", namespace="envoy-gateway-system", chart="gateway-helm", repo_url=chart_repo, version="v1.9.0")
    install_release(None, release, kubeconfig_path=str(kubeconfig_path))
    emulated.call(_add_gateway_class, emulated, accepted_class or "eg", accepted_class is None)
    if accepted_class is not None:
        deadline = time.monotonic() + 10
        while not _accepted(emulated, accepted_class):
            assert time.monotonic() < deadline, "the stand-in controller did not accept the GatewayClass"
            time.sleep(0.1)


async def _add_gateway_class(emulated, name: str, stop_controller: bool) -> None:
    api = emulated.emulator
    async with api._lock:
        if stop_controller:
            await api.delete_object(api.served("apps", "v1", "deployments"), "envoy-gateway-system", "envoy-gateway", dry_run=False)
        spec = api.served(GATEWAY_GROUP, "v1", "gatewayclasses")
        body = {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "GatewayClass", "metadata": {"name": name},
                "spec": {"controllerName": EG_CONTROLLER}}
        await api.add_object(spec, api.build_object(spec, body, None, keep_status=False))


def _accepted(emulated, name: str) -> bool:
    for gateway_class in emulated.objects_of("gatewayclasses", GATEWAY_GROUP, "v1"):
        if gateway_class["metadata"]["name"] == name:
            return any(c["type"] == "Accepted" and c["status"] == "True" for c in (gateway_class.get("status") or {}).get("conditions") or [])
    return False


def test_skip_ingress_uses_the_clusters_envoy_gateway_and_a_gateway_that_is_never_programmed_stops_with_the_fix(
        attach_settings, bare_cluster, live_server, chart_repo):
    attach_settings.GSHARE_ATTACH_GATEWAY_TIMEOUT = 2.0
    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5  # no operator runs here: a run that gets that far stops at step 10
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=False)
    install_envoy_gateway_as_its_guide_does(emulated, kubeconfig_path, chart_repo)

    # Envoy Gateway as its guide installs it: the attach finds it and creates the session Gateway, which gets no address
    # (a LoadBalancer Service nothing serves): stopped, with the command that gives Envoy the ingress node's host network.
    run = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert ("[5/10] session routing ... FAILED: the Gateway gshare-system/gshare-sessions is not Programmed after 2 s (Programmed: "
            "False, reason AddressNotAssigned: No addresses have been assigned to the Gateway)") in run.out, run.out + run.err
    fix = fix_of(run).splitlines()
    assert fix[0] == ("see why: kubectl -n gshare-system describe gateway gshare-sessions; kubectl -n envoy-gateway-system get "
                      "deploy,pods; kubectl -n envoy-gateway-system logs deploy/envoy-gateway")
    rerun = run.rerun.replace(" --skip-ingress", "") + " --routing gateway-api"
    assert fix[1].endswith(f"host network: {rerun}")
    gateway = next(g for g in emulated.objects_of("gateways", GATEWAY_GROUP, "v1"))
    assert gateway["spec"]["gatewayClassName"] == "eg" and not Cluster.objects.exists()

    # The fix: the attach upgrades the guide's release "eg" with its values, and the Gateway is programmed.
    run = attach(kubeconfig_path, live_server, "--routing", "gateway-api")
    assert "[5/10] session routing ... ok: Envoy Gateway v1.9.0 on lab-c1-cp-01: release eg upgraded (revision 2)" in run.out, run.out + run.err
    assert "Gateway gshare-system/gshare-sessions applied" in run.out and ", Programmed at " in run.out
    assert "[10/10] connection test and first inventory ... FAILED" in run.out
    assert [r["version"] for r in helm_releases(emulated)["eg"] if r["status"] == "deployed"] == ["2"]
    cluster = Cluster.objects.get(name="lab-c1")
    assert (cluster.routing, cluster.gateway_namespace, cluster.gateway_name) == ("gateway-api", "gshare-system", "gshare-sessions")

    # From now on --skip-ingress finds Envoy Gateway (both GatewayClasses Accepted) and keeps the Gateway as it is.
    run = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert ("[5/10] session routing ... skipped install (--skip-ingress): Envoy Gateway found (GatewayClass eg, gshare-envoy-gateway); "
            "Gateway gshare-system/gshare-sessions applied") in run.out, run.out + run.err
    assert RETIREMENT not in run.out
    assert [g["spec"]["gatewayClassName"] for g in emulated.objects_of("gateways", GATEWAY_GROUP, "v1")] == ["gshare-envoy-gateway"]


def test_skip_ingress_with_a_gateway_named_by_the_flag_that_is_not_gshares_uses_it_as_it_is(
        attach_settings, bare_cluster, live_server, chart_repo):
    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=False)
    run = attach(kubeconfig_path, live_server, "--gateway", "edge/sessions")  # gShare's own Gateway, in namespace edge
    assert "Gateway edge/sessions created" in run.out, run.out + run.err
    assert Cluster.objects.get(name="lab-c1").gateway_namespace == "edge"
    emulated.call(_unmanage_gateway, emulated, "edge", "sessions")
    run = attach(kubeconfig_path, live_server, "--skip-ingress", "--gateway", "edge/sessions", "--routing", "gateway-api")
    assert "Gateway edge/sessions found (not gShare's: used as it is), Programmed at " in run.out, run.out + run.err
    (gateway,) = emulated.objects_of("gateways", GATEWAY_GROUP, "v1")
    assert "app.kubernetes.io/managed-by" not in gateway["metadata"].get("labels", {})


async def _unmanage_gateway(emulated, namespace: str, name: str) -> None:
    import copy

    api = emulated.emulator
    async with api._lock:
        spec = api.served(GATEWAY_GROUP, "v1", "gateways")
        current = api.get_object(spec, namespace, name)
        updated = copy.deepcopy(current)
        updated["metadata"]["labels"] = {"team": "platform"}
        await api.write_object(spec, updated, current)


@pytest.mark.parametrize("case", ["nothing", "both", "ingress-nginx wanted", "gateway-api wanted", "envoy gateway down"])
def test_skip_ingress_stops_with_the_fix_when_it_finds_no_controller_to_use(attach_settings, bare_cluster, live_server, chart_repo, case):
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=case in ("both", "gateway-api wanted"))
    if case in ("both", "ingress-nginx wanted"):
        install_envoy_gateway_as_its_guide_does(emulated, kubeconfig_path, chart_repo)
    if case == "envoy gateway down":
        install_envoy_gateway_as_its_guide_does(emulated, kubeconfig_path, chart_repo, accepted_class=None)
    flags = {"ingress-nginx wanted": ["--routing", "ingress-nginx"], "gateway-api wanted": ["--routing", "gateway-api"]}.get(case, [])
    run = attach(kubeconfig_path, live_server, "--skip-ingress", *flags)
    assert "[5/10] session routing ... FAILED" in run.out and "[6/10]" not in run.out, run.out + run.err
    fix = fix_of(run)
    install = run.rerun.replace(" --skip-ingress", "")
    if flags:
        install = install.replace(" --routing ingress-nginx", "").replace(" --routing gateway-api", "")
    if case == "nothing":
        assert str(run.error) == ("--skip-ingress: the cluster runs no routing controller gShare uses (no GatewayClass of controller "
                                  "gateway.envoyproxy.io/gatewayclass-controller; no IngressClass of controller k8s.io/ingress-nginx)")
        assert fix.splitlines()[0] == f"let the attach install Envoy Gateway (Gateway API routing): {install} --routing gateway-api"
        assert ("helm install eg oci://docker.io/envoyproxy/gateway-helm --version v1.9.0 -n envoy-gateway-system --create-namespace "
                "--set config.envoyGateway.extensionApis.enableBackend=true") in fix
        assert "controllerName: gateway.envoyproxy.io/gatewayclass-controller" in fix
    elif case == "both":
        assert str(run.error).startswith("--skip-ingress: the cluster runs both ingress-nginx (IngressClass nginx) and Envoy Gateway "
                                         "(GatewayClass eg)")
        assert fix.splitlines() == [f"{run.rerun} --routing gateway-api",
                                    f"or (ingress-nginx is retired upstream): {run.rerun} --routing ingress-nginx"]
    elif case == "ingress-nginx wanted":
        assert "the cluster has no IngressClass of controller k8s.io/ingress-nginx" in str(run.error)
        assert fix.splitlines()[0] == f"let the attach install Gateway API routing instead (recommended): {install} --routing gateway-api"
    elif case == "gateway-api wanted":
        assert "no GatewayClass of controller gateway.envoyproxy.io/gatewayclass-controller" in str(run.error)
        assert fix.splitlines()[0] == f"let the attach install Envoy Gateway: {install} --routing gateway-api"
    else:
        assert "the GatewayClass eg of Envoy Gateway is not Accepted (is Envoy Gateway running? kubectl -n envoy-gateway-system get "\
               "deploy envoy-gateway)" in str(run.error)
    assert not Cluster.objects.exists() and not emulated.objects_of("gateways", GATEWAY_GROUP, "v1")


def test_envoy_gateway_comes_from_an_oci_registry_by_default(attach_settings, bare_cluster, live_server):
    """The real chart is an OCI artifact (``oci://docker.io/envoyproxy/gateway-helm``): Helm pulls ``<base>/gateway-helm`` at
    the pinned version. A registry on loopback that refuses connections shows the reference Helm was given."""
    attach_settings.GSHARE_ATTACH_ENVOY_GATEWAY_REPO = "oci://127.0.0.1:9/envoyproxy"
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=False)
    run = attach(kubeconfig_path, live_server)
    assert "[5/10] session routing ... FAILED: Helm could not install Envoy Gateway v1.9.0 on lab-c1-cp-01 (release eg in "\
           "envoy-gateway-system)" in run.out, run.out + run.err
    # The OCI distribution API's manifest request for the tag: Helm was given the oci:// reference at the version.
    assert "https://127.0.0.1:9/v2/envoyproxy/gateway-helm/manifests/v1.9.0" in str(run.error)
    assert fix_of(run) == ("check the chart can be fetched and rendered: helm template eg oci://127.0.0.1:9/envoyproxy/gateway-helm "
                           "--version v1.9.0")
    assert "eg" not in helm_releases(emulated)


def test_moving_a_cluster_from_ingress_nginx_to_gateway_api_is_a_rerun_with_the_other_routing(attach_settings, bare_cluster, live_server):
    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5  # no operator runs here: each run stops at step 10, registered
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=False)
    run = attach(kubeconfig_path, live_server, "--routing", "ingress-nginx")
    assert "[7/10] register with the control plane ... ok: registered as" in run.out and RETIREMENT in run.out, run.out + run.err
    cluster = Cluster.objects.get(name="lab-c1")
    assert cluster.routing == "ingress-nginx"

    run = attach(kubeconfig_path, live_server, "--routing", "gateway-api")
    assert "[5/10] session routing ... ok: Envoy Gateway v1.9.0 on lab-c1-cp-01: release eg installed (revision 1)" in run.out, run.out + run.err
    assert f"already registered as {cluster.public_id} (kept, updated routing; credential checked)" in run.out
    cluster.refresh_from_db()
    assert (cluster.routing, cluster.gateway_namespace, cluster.gateway_name) == ("gateway-api", "gshare-system", "gshare-sessions")
    assert RETIREMENT not in run.out

    # From then on the command without --routing keeps the cluster on Gateway API (Envoy Gateway is there).
    run = attach(kubeconfig_path, live_server)
    assert "release eg unchanged (revision 1)" in run.out and "updated routing" not in run.out, run.out + run.err
