"""The control plane's least-privilege credential (``attach.least_privilege``) against the Kubernetes emulator
with RBAC enforced: every apiserver call the control plane makes works with it (probe and connection test, session
apply and delete, the operator token push, the storage pool check, the PVC delete, a volume move), and it holds no
more (no Secrets listed or read besides the operator token, no Pods created, nothing written cluster-wide); the
connection test's ``credential_least_privilege`` check tells it from an admin kubeconfig."""

from __future__ import annotations

import pytest
import yaml
from django.utils import timezone

import contract
from attach import least_privilege
from clusters import services
from clusters.operator_token.rotation import OperatorTokenPushFailed, operator_token_push
from clusters.probe import probe_cluster
from demo import fleet
from kube import KubeGateway, KubeRefused
from kube.gateway import (
    CLUSTER_ROLES,
    GATEWAY_CLASSES,
    GATEWAYS,
    INGRESS_CLASSES,
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUMES,
    PODS,
    SECRETS,
    SELF_SUBJECT_RULES_REVIEWS,
)
from kube.kubeconfig import validate_kubeconfig
from sessions import lifecycle
from sessions.models import Session
from storage import services as storage_services
from storage.models import StoragePool, Volume
from storage.move import volume_move
from tests.factories import SessionFactory
from tests.helpers import kubeconfig_text
from tests.storage.test_move import CSI, make_volume, seed_bound_claim

pytestmark = pytest.mark.django_db

SA_USER = "system:serviceaccount:gshare-system:gshare-control-plane"


def admin_config(emulated, settings) -> dict:
    return validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config


@pytest.fixture
def least(fleet_cluster, settings):
    """Factory: ``start(name, objects=None) -> (Cluster, EmulatedCluster)``, an emulated fleet cluster (seeded with
    ``objects`` when given) registered through the service
    with the kubeconfig ``least_privilege_kubeconfig`` made for it (the emulator enforces RBAC on that token)."""

    def start(name: str = "lab-c1", objects: list[dict] | None = None):
        emulated = fleet_cluster(name, objects=objects)
        text = least_privilege.least_privilege_kubeconfig(admin_config(emulated, settings), server=emulated.url, timeout=10)
        cluster = services.cluster_register(name=name, kubeconfig=text, session_domain=f"{name}.example.com")
        return cluster, emulated

    return start


def gateway(cluster) -> KubeGateway:
    return KubeGateway.for_cluster(cluster, call_timeout=10)


def forbidden(call, *args, **kwargs) -> KubeRefused:
    with pytest.raises(KubeRefused) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 403, caught.value
    return caught.value


def test_the_credential_is_a_service_account_token_with_the_admins_server_and_ca(fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1", tls=True)
    config = admin_config(emulated, settings)
    text = least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10)
    made = yaml.safe_load(text)
    assert made["clusters"][0]["cluster"] == config["clusters"][0]["cluster"]  # server and certificate-authority-data
    token = made["users"][0]["user"]["token"]
    assert token and token != emulated.token
    # The token Secret holds what the tokens controller writes (the CA included, over TLS).
    secret = next(s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == least_privilege.TOKEN_SECRET_NAME)
    assert secret["type"] == "kubernetes.io/service-account-token" and "ca.crt" in secret["data"]
    # A second run keeps the Secret, so the same token: a re-attach registers the same credential.
    again = yaml.safe_load(least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10))
    assert again["users"][0]["user"]["token"] == token
    with KubeGateway.for_kubeconfig(made, call_timeout=10) as kube:
        review = kube.create({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                              "spec": {"namespace": settings.GSHARE_OPERATOR_NAMESPACE}})
    rules = review["status"]["resourceRules"]
    assert {"verbs": ["get", "update"], "apiGroups": [""], "resources": ["secrets"],
            "resourceNames": [settings.GSHARE_OPERATOR_TOKEN_SECRET]} in rules
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in rules)
    assert SELF_SUBJECT_RULES_REVIEWS.plural == "selfsubjectrulesreviews"


def test_probe_and_connection_test_pass_and_report_least_privilege(least):
    cluster, _ = least()
    Cluster = type(cluster)
    cluster.last_heartbeat_at = timezone.now()
    cluster.save(update_fields=["last_heartbeat_at"])
    report = services.cluster_connection_test(cluster=cluster)
    assert report["checks"] == {"apiserver_reachable": True, "runtime_class_nvidia": True, "hami_device_plugin": True,
                                "gpu_nodes": True, "credential_least_privilege": True, "operator_reporting": True}
    assert report["status"] == "connected"
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.CONNECTED and cluster.kube_system_uid
    result = probe_cluster(yaml.safe_load(cluster.kubeconfig), server=cluster.apiserver_url, timeout=10)
    assert result.kube_system_uid == cluster.kube_system_uid and not result.identity_forbidden


def test_an_admin_kubeconfig_is_reported_but_stays_connected(fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster = services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain="lab-c1.example.com")
    cluster.last_heartbeat_at = timezone.now()
    cluster.save(update_fields=["last_heartbeat_at"])
    report = services.cluster_connection_test(cluster=cluster)
    assert report["checks"]["credential_least_privilege"] is False
    assert "attach_cluster" in report["detail"]["credential_least_privilege"]
    assert report["status"] == "connected"  # advisory: an admin credential works


def test_sessions_are_applied_and_deleted(least, settings):
    cluster, emulated = least()
    session = SessionFactory(cluster=cluster, phase=Session.Phase.SCHEDULED)
    session = lifecycle.session_apply(session=session)
    assert session.phase == Session.Phase.STARTING, session.message
    group = (contract.GSHARE_SESSION_PLURAL, contract.GSHARE_API_GROUP, contract.GSHARE_API_VERSION)
    assert [o["metadata"]["namespace"] for o in emulated.objects_of(*group)] == [settings.GSHARE_SESSION_NAMESPACE]
    lifecycle.session_delete_remote(session=session)
    assert emulated.objects_of(*group) == []


def test_the_operator_token_replaces_the_secret_the_attach_made_and_a_missing_one_names_the_fix(least, settings):
    cluster, emulated = least()
    ns, name = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_OPERATOR_TOKEN_SECRET
    assert operator_token_push(cluster).secret_action == "replaced"  # created empty by the credential step (admin)
    assert operator_token_push(cluster).secret_action == "replaced"
    cluster.refresh_from_db()
    assert not cluster.operator_token_rotation_error
    with KubeGateway.for_kubeconfig(admin_config(emulated, settings), call_timeout=10) as admin:
        admin.delete(SECRETS, name, namespace=ns)
    with pytest.raises(OperatorTokenPushFailed) as refused:  # the credential may not create Secrets
        operator_token_push(cluster)
    assert refused.value.code == "token_push_forbidden"
    assert f"kubectl -n {ns} create secret generic {name}" in refused.value.detail and "re-run the attach" in refused.value.detail


def test_storage_class_check_and_pvc_delete(least, settings, plain_user):
    cluster, emulated = least()
    storage_services.pool_check_storage_class(cluster=cluster, storage_class=fleet.STORAGE_CLASS)
    with pytest.raises(Exception) as missing:
        storage_services.pool_check_storage_class(cluster=cluster, storage_class="no-such-class")
    assert getattr(missing.value, "code", "") == "storage_class_missing"
    pool = StoragePool.objects.create(name="tank", cluster=cluster, storage_class=fleet.STORAGE_CLASS)
    volume = Volume.objects.create(owner=plain_user, pool=pool, name="scratch", quota_gb=1, cluster=cluster,
                                   claim_name="gshare-scratch-claim", status=Volume.Status.BOUND)
    emulated.add({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                  "metadata": {"name": volume.claim_name, "namespace": settings.GSHARE_SESSION_NAMESPACE},
                  "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": fleet.STORAGE_CLASS,
                           "resources": {"requests": {"storage": "1Gi"}}}})
    storage_services._pvc_delete(volume)
    assert not [c for c in emulated.objects_of("persistentvolumeclaims") if c["metadata"]["name"] == volume.claim_name]


def test_a_volume_moves_with_the_move_rights(least, settings, plain_user):
    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    (a, emulated_a), (b, emulated_b) = least("lab-c1"), least("lab-c2")
    volume = make_volume(plain_user, a)
    seed_bound_claim(emulated_a, volume, source={"csi": CSI})
    moved = volume_move(volume=volume, cluster=b)
    assert moved.cluster_id == b.pk
    assert [c["metadata"]["name"] for c in emulated_b.objects_of("persistentvolumeclaims")] == [volume.claim_name]


def test_without_the_move_setting_there_are_no_persistent_volume_rights(least):
    cluster, _ = least()
    with gateway(cluster) as kube:
        forbidden(kube.get, PERSISTENT_VOLUMES, "any")


def test_it_may_do_nothing_more(least, settings):
    cluster, emulated = least()
    operator_ns, sessions_ns = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_SESSION_NAMESPACE
    with gateway(cluster) as kube:
        refused = forbidden(kube.list, SECRETS, namespace=operator_ns)
        assert refused.message == (f'secrets is forbidden: User "{SA_USER}" cannot list resource "secrets" in API group "" '
                                   f'in the namespace "{operator_ns}"')
        forbidden(kube.list, SECRETS)
        forbidden(kube.get, SECRETS, least_privilege.TOKEN_SECRET_NAME, namespace=operator_ns)  # not even its own token
        forbidden(kube.create, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": sessions_ns},
                                "spec": {"containers": [{"name": "x", "image": "busybox"}]}})
        forbidden(kube.list, PODS, namespace=sessions_ns)
        forbidden(kube.patch, NODES, "lab-c1-cp-01", {"metadata": {"labels": {"x": "y"}}})
        node = forbidden(kube.get, NODES, "lab-c1-cp-01")
        assert "cannot get resource \"nodes\" in API group \"\" at the cluster scope" in node.message
        forbidden(kube.get, NAMESPACES, "default")
        forbidden(kube.create, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "kube-system"}})
        review = kube.create({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                              "spec": {"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}})
        assert review["status"]["allowed"] is False



def test_the_routing_reads_are_allowed_and_nothing_more_of_routing(least, settings):
    from tests.clusters.test_routing_probe import condition, gateway_api_crds, gateway_class, ingress_class
    from tests.clusters.test_routing_probe import gateway as gateway_object

    objects = [*fleet.cluster_objects("lab-c1"), *gateway_api_crds(), ingress_class(), gateway_class(condition("Accepted")),
               gateway_object(condition("Accepted"), condition("Programmed"))]
    cluster, emulated = least(objects=objects)
    routing = services.cluster_connection_test(cluster=cluster)["routing"]
    assert (routing["mode"], routing["controller"]) == ("ingress-nginx", True), routing
    cluster = services.cluster_update(cluster=cluster, changes={"routing": contract.ROUTING_GATEWAY_API})
    routing = services.cluster_connection_test(cluster=cluster)["routing"]
    assert (routing["controller"], routing["gateway_programmed"]) == (True, True), routing
    with KubeGateway.for_cluster(cluster, call_timeout=10) as kube:
        forbidden(kube.create, ingress_class(name="mine"))
        forbidden(kube.patch, GATEWAY_CLASSES, "envoy-gateway", {"spec": {"description": "x"}})
        forbidden(kube.create, {**gateway_object(), "metadata": {"name": "mine", "namespace": "gshare-system"}})
        forbidden(kube.patch, GATEWAYS, "gshare-sessions", {"metadata": {"labels": {"x": "y"}}}, namespace="gshare-system")
        forbidden(kube.delete, GATEWAYS, "gshare-sessions", namespace="gshare-system")
        forbidden(kube.delete, INGRESS_CLASSES, "nginx")
    assert len(emulated.objects_of("gateways", "gateway.networking.k8s.io", "v1")) == 1


def test_a_credential_from_before_the_routing_reads_is_told_to_rerun_attach(least, settings):
    cluster, emulated = least()
    rules = [rule for rule in least_privilege.control_plane_rules()["cluster"]
             if not {"ingressclasses", "gatewayclasses", "gateways"} & set(rule["resources"])]
    with KubeGateway.for_kubeconfig(admin_config(emulated, settings), call_timeout=10) as admin:
        admin.patch(CLUSTER_ROLES, least_privilege.ROLE_NAME, {"rules": rules})
    for mode in (contract.ROUTING_INGRESS_NGINX, contract.ROUTING_GATEWAY_API):
        cluster = services.cluster_update(cluster=cluster, changes={"routing": mode})
        routing = services.cluster_connection_test(cluster=cluster)["routing"]
        assert routing["controller"] is None, routing
        assert "may not read" in routing["detail"] and "attach_cluster" in routing["detail"]
