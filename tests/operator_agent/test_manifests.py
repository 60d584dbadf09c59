"""The session's Pod, Service and Ingress (operator_agent.manifests.session) and the GShareSession CRD, against Kubernetes 1.32."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kopf
import kubernetes_validate
import pytest
import yaml

from contract import (
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_KIND,
    GSHARE_SESSION_PLURAL,
    SESSION_ID_LABEL,
    SESSION_PHASES,
    VOLUME_ID_LABEL,
    VOLUME_MANAGED_BY,
    VOLUME_NAME_LABEL,
    session_object_name,
)
from operator_agent.manifests.routing.ingress_nginx import session_ingress
from operator_agent.manifests.session import (
    pod_volume_name,
    session_owner_reference,
    session_pod,
    session_pvc,
    session_service,
)

KUBERNETES_VERSION = "1.32"
SESSION_ID = "ses_ab12cd34ef56gh78"
NAME = "ses-ab12cd34ef56gh78"

GSS = {
    "apiVersion": "gshare.io/v1alpha1",
    "kind": "GShareSession",
    "metadata": {
        "name": NAME,
        "namespace": "gshare-sessions",
        "uid": "0d3f8d7e-9b0e-4c1e-a8e1-5c1f3b2a7d90",
        "labels": {SESSION_ID_LABEL: SESSION_ID, "gshare.io/cluster-id": "clu_x7k2abcd3efgh4ij"},
    },
    "spec": {
        "sessionId": SESSION_ID,
        "owner": "alice",
        "image": "quay.io/jupyter/base-notebook:2024-12-02",
        "gpus": 1,
        "gpuMemoryMiB": 8192,
        "gpuCores": 30,
        "port": 8888,
        "host": "lab-c1.gshare.localhost",
        "path": f"/s/{SESSION_ID}/",
        "authUrl": "https://gshare.example.com/internal/connect/verify",
    },
}


def whole_gpus() -> dict:
    gss = copy.deepcopy(GSS)
    gss["spec"].update(gpus=2, port=9000)
    del gss["spec"]["gpuMemoryMiB"], gss["spec"]["gpuCores"]
    return gss


BUILDERS = [session_pod, session_service, session_ingress]


@pytest.mark.parametrize("gss", [GSS, whole_gpus()], ids=["shared", "whole"])
@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
def test_objects_validate_against_kubernetes_schema(build, gss):
    obj = build(gss)
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    json.dumps(obj)  # plain JSON: ready for create / server-side apply


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
def test_common_metadata(build):
    obj = build(GSS)
    meta = obj["metadata"]
    assert meta["name"] == session_object_name(SESSION_ID) == NAME
    assert meta["namespace"] == "gshare-sessions"
    assert meta["labels"][SESSION_ID_LABEL] == SESSION_ID
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "gshare-operator"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "gshare.io/v1alpha1",
            "kind": "GShareSession",
            "name": NAME,
            "uid": GSS["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_owner_reference_is_kopfs():
    assert session_owner_reference(GSS) == kopf.build_owner_reference(GSS)


def test_builders_are_pure():
    before = copy.deepcopy(GSS)
    first = [build(GSS) for build in BUILDERS]
    assert GSS == before
    assert [build(GSS) for build in BUILDERS] == first
    first[0]["metadata"]["labels"]["x"] = "y"  # no shared sub-dicts between calls
    assert "x" not in session_pod(GSS)["metadata"]["labels"]


def test_pod():
    pod = session_pod(GSS)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"gpu": "on"}
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    (container,) = spec["containers"]
    assert container["image"] == "quay.io/jupyter/base-notebook:2024-12-02"
    assert container["ports"] == [{"name": "http", "containerPort": 8888, "protocol": "TCP"}]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"}
    }
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GSHARE_SESSION_ID"] == SESSION_ID
    assert env["GSHARE_BASE_PATH"] == f"/s/{SESSION_ID}/"
    assert env["NOTEBOOK_ARGS"] == f"--ServerApp.base_url=/s/{SESSION_ID}/ --ServerApp.port=8888"


def test_pod_whole_gpus_asks_only_for_gpus():
    pod = session_pod(whole_gpus())
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert container["ports"][0]["containerPort"] == 9000


def test_service():
    service = session_service(GSS)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {SESSION_ID_LABEL: SESSION_ID}
    assert service["spec"]["ports"] == [{"name": "http", "port": 8888, "targetPort": "http", "protocol": "TCP"}]
    # The selector matches the pod's labels.
    pod_labels = session_pod(GSS)["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())


def test_ingress():
    ingress = session_ingress(GSS)
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/auth-url"] == "https://gshare.example.com/internal/connect/verify"
    assert annotations["nginx.ingress.kubernetes.io/auth-response-headers"] == "X-Auth-Request-User"
    assert annotations["nginx.ingress.kubernetes.io/auth-always-set-cookie"] == "true"
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == "3600"
    assert "nginx.ingress.kubernetes.io/auth-signin" not in annotations
    assert all(isinstance(v, str) for v in annotations.values())
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    (rule,) = spec["rules"]
    assert rule["host"] == "lab-c1.gshare.localhost"
    (path,) = rule["http"]["paths"]
    assert path == {
        "path": f"/s/{SESSION_ID}/",
        "pathType": "Prefix",
        "backend": {"service": {"name": NAME, "port": {"name": "http"}}},
    }
    assert path["backend"]["service"]["port"]["name"] == session_service(GSS)["spec"]["ports"][0]["name"]


# --------------------------------------------------------------------------- the GShareSession CRD

CRD_FILE = Path(__file__).resolve().parents[2] / "charts" / "gshare-operator" / "crds" / "gsharesessions.gshare.io.yaml"


def crd() -> dict:
    return yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))


def crd_schema() -> dict:
    (version,) = crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def test_crd_validates_and_matches_the_contract():
    obj = crd()
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert obj["metadata"]["name"] == f"{GSHARE_SESSION_PLURAL}.{GSHARE_API_GROUP}"
    assert obj["spec"]["group"] == GSHARE_API_GROUP
    assert obj["spec"]["scope"] == "Namespaced"
    assert obj["spec"]["names"]["kind"] == GSHARE_SESSION_KIND
    assert obj["spec"]["names"]["shortNames"] == ["gss"]
    (version,) = obj["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (GSHARE_API_VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    assert crd_schema()["properties"]["status"]["properties"]["phase"]["enum"] == list(SESSION_PHASES)


@pytest.mark.parametrize("gss", [GSS, whole_gpus()], ids=["shared", "whole"])
def test_contract_example_matches_the_crd_schema(gss):
    body = {k: v for k, v in gss.items() if k != "metadata"}
    body["status"] = {"phase": "Running", "node": "gpu-h100-01", "devices": ["GPU-x"], "message": "",
                      "observedAt": "2026-11-29T16:00:00.123456Z"}
    jsonschema.validate(body, crd_schema())


@pytest.mark.parametrize(
    ("field", "value"),
    [("sessionId", "ses-with-dash"), ("gpus", 0), ("gpuCores", 101), ("path", "/s/no-trailing-slash"), ("authUrl", "ftp://x")],
)
def test_crd_schema_refuses_bad_specs(field, value):
    body = {"apiVersion": GSS["apiVersion"], "kind": GSS["kind"], "spec": {**GSS["spec"], field: value}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, crd_schema())


# --------------------------------------------------------------------------- session volumes

VOLUMES = [
    {"volumeId": "vol_abc234", "name": "datasets", "claimName": "gshare-vol-abc234", "storageClassName": "nfs-a",
     "size": "100Gi", "mountPath": "/data/datasets"},
    {"volumeId": "vol_xyz567", "name": "scratch", "claimName": "gshare-vol-xyz567", "storageClassName": "nfs-a",
     "size": "5Gi", "mountPath": "/data/scratch"},
]


def with_volumes(volumes=VOLUMES) -> dict:
    gss = copy.deepcopy(GSS)
    gss["spec"]["volumes"] = copy.deepcopy(volumes)
    return gss


@pytest.mark.parametrize("volume", VOLUMES, ids=lambda v: v["name"])
def test_session_pvc_validates_and_follows_the_contract(volume):
    pvc = session_pvc(volume, "gshare-sessions")
    kubernetes_validate.validate(pvc, KUBERNETES_VERSION, strict=True)
    json.dumps(pvc)
    assert (pvc["apiVersion"], pvc["kind"]) == ("v1", "PersistentVolumeClaim")
    meta = pvc["metadata"]
    assert (meta["name"], meta["namespace"]) == (volume["claimName"], "gshare-sessions")
    assert meta["labels"] == {"app.kubernetes.io/managed-by": VOLUME_MANAGED_BY, VOLUME_ID_LABEL: volume["volumeId"],
                              VOLUME_NAME_LABEL: volume["name"]}
    assert VOLUME_MANAGED_BY == "gshare"
    assert "ownerReferences" not in meta  # the volume outlives the session
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs-a",
                           "resources": {"requests": {"storage": volume["size"]}}}
    assert "volumeName" not in pvc["spec"]


def test_session_pvc_is_pure():
    volume = copy.deepcopy(VOLUMES[0])
    first = session_pvc(volume, "ns")
    first["metadata"]["labels"]["x"] = "y"
    first["spec"]["accessModes"].append("ReadWriteOnce")
    assert volume == VOLUMES[0]
    assert session_pvc(volume, "ns") == session_pvc(VOLUMES[0], "ns") != first


@pytest.mark.parametrize("gss", [with_volumes(), with_volumes([VOLUMES[0]])], ids=["two", "one"])
def test_pod_with_volumes_validates(gss):
    kubernetes_validate.validate(session_pod(gss), KUBERNETES_VERSION, strict=True)


def test_pod_mounts_each_volume_at_its_path():
    spec = session_pod(with_volumes())["spec"]
    assert spec["volumes"] == [
        {"name": "vol-datasets", "persistentVolumeClaim": {"claimName": "gshare-vol-abc234"}},
        {"name": "vol-scratch", "persistentVolumeClaim": {"claimName": "gshare-vol-xyz567"}},
    ]
    (container,) = spec["containers"]
    assert container["volumeMounts"] == [{"name": "vol-datasets", "mountPath": "/data/datasets"},
                                         {"name": "vol-scratch", "mountPath": "/data/scratch"}]


@pytest.mark.parametrize("gss", [GSS, with_volumes([])], ids=["absent", "empty"])
def test_pod_without_volumes_is_unchanged(gss):
    spec = session_pod(gss)["spec"]
    assert "volumes" not in spec and "volumeMounts" not in spec["containers"][0]
    assert session_pod(gss) == session_pod(GSS)


def test_pod_volume_names_are_dns_labels_even_for_the_longest_volume_names():
    assert pod_volume_name("datasets") == "vol-datasets"
    longest = "a" * 30 + "-" + "b" * 32  # 63 characters, the longest volume name
    other = "a" * 30 + "-" + "b" * 31 + "c"
    name, other_name = pod_volume_name(longest), pod_volume_name(other)
    assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert name.startswith("vol-aaaa") and name != other_name
    gss = with_volumes([{**VOLUMES[0], "name": longest}])
    kubernetes_validate.validate(session_pod(gss), KUBERNETES_VERSION, strict=True)


def test_contract_volumes_match_the_crd_schema():
    body = {k: v for k, v in with_volumes().items() if k != "metadata"}
    jsonschema.validate(body, crd_schema())
    volumes = crd_schema()["properties"]["spec"]["properties"]["volumes"]
    assert set(volumes["items"]["required"]) == {"volumeId", "name", "claimName", "storageClassName", "size", "mountPath"}
    assert "volumes" not in crd_schema()["properties"]["spec"]["required"]  # may be absent


@pytest.mark.parametrize(("field", "value"), [
    ("volumeId", "abc"), ("name", "Data_Sets"), ("claimName", "Bad_Name"), ("storageClassName", ""),
    ("size", "lots"), ("mountPath", "data"),
])
def test_crd_schema_refuses_bad_volumes(field, value):
    body = {"apiVersion": GSS["apiVersion"], "kind": GSS["kind"], "spec": with_volumes([{**VOLUMES[0], field: value}])["spec"]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, crd_schema())


def test_crd_schema_requires_every_volume_field():
    for missing in VOLUMES[0]:
        volume = {k: v for k, v in VOLUMES[0].items() if k != missing}
        body = {"apiVersion": GSS["apiVersion"], "kind": GSS["kind"], "spec": with_volumes([volume])["spec"]}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(body, crd_schema())


# --------------------------------------------------------------------------- GPU models (HAMi nvidia.com/use-gputype)


def with_models(models) -> dict:
    gss = copy.deepcopy(GSS)
    gss["spec"]["gpuModels"] = list(models)
    return gss


def test_pod_with_gpu_models_carries_hamis_use_gputype_annotation():
    pod = session_pod(with_models(["NVIDIA H100 80GB HBM3", "NVIDIA H100-SXM5-80GB"]))
    assert pod["metadata"]["annotations"] == {"nvidia.com/use-gputype": "NVIDIA H100 80GB HBM3,NVIDIA H100-SXM5-80GB"}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    jsonschema.validate({k: v for k, v in with_models(["NVIDIA H100 80GB HBM3"]).items() if k != "metadata"}, crd_schema())


def test_pod_with_gpu_uuids_is_limited_to_those_gpus_exactly():
    """HAMi matches ``use-gputype`` by substring (``NVIDIA A10`` is in ``NVIDIA A100-PCIE-40GB``): ``spec.gpuUuids``,
    sent for such clusters, adds ``use-gpuuuid``, an exact match."""
    gss = with_models(["NVIDIA A10"])
    gss["spec"]["gpuUuids"] = ["GPU-a10-0", "GPU-a10-1"]
    pod = session_pod(gss)
    assert pod["metadata"]["annotations"] == {"nvidia.com/use-gputype": "NVIDIA A10", "nvidia.com/use-gpuuuid": "GPU-a10-0,GPU-a10-1"}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    jsonschema.validate({k: v for k, v in gss.items() if k != "metadata"}, crd_schema())
    for bad in (["GPU-1,GPU-2"], [""], "GPU-1"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**{k: v for k, v in gss.items() if k != "metadata"}, "spec": {**gss["spec"], "gpuUuids": bad}},
                                crd_schema())


@pytest.mark.parametrize("models", [None, []], ids=["absent", "empty"])
def test_pod_without_gpu_models_has_no_annotation(models):
    gss = copy.deepcopy(GSS)
    if models is not None:
        gss["spec"]["gpuModels"] = models
    assert "annotations" not in session_pod(gss)["metadata"]


@pytest.mark.parametrize("models", [["a,b"], [""], ["x" * 129], [1], "H100"], ids=["comma", "empty", "long", "number", "string"])
def test_crd_schema_refuses_bad_gpu_models(models):
    body = {"apiVersion": GSS["apiVersion"], "kind": GSS["kind"], "spec": {**GSS["spec"], "gpuModels": models}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, crd_schema())


# --------------------------------------------------------------------------- CPU and memory


def with_resources(cpu: int = 4000, memory: int = 16384, volumes=None) -> dict:
    gss = copy.deepcopy(GSS)
    gss["spec"].update(cpuMillicores=cpu, memoryMiB=memory)
    if volumes:
        gss["spec"]["volumes"] = copy.deepcopy(volumes)
    return gss


@pytest.mark.parametrize(("cpu", "memory", "cpu_text", "shm"), [(4000, 16384, "4", "8192Mi"), (500, 1025, "500m", f"{1025 * 512}Ki"),
                                                               (1, 1, "1m", "512Ki")])
def test_pod_asks_cpu_and_memory_as_requests_equal_to_limits_with_half_of_it_as_shm(cpu, memory, cpu_text, shm):
    pod = session_pod(with_resources(cpu, memory, volumes=VOLUMES))
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": cpu_text, "memory": f"{memory}Mi"}
    assert {k: container["resources"]["limits"][k] for k in ("cpu", "memory")} == container["resources"]["requests"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["volumeMounts"][-1] == {"name": "dshm", "mountPath": "/dev/shm"}
    assert pod["spec"]["volumes"][-1] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    assert len(pod["spec"]["volumes"]) == len(VOLUMES) + 1  # the gShare volumes are still mounted


def test_pod_without_cpu_and_memory_keeps_its_old_shape():
    pod = session_pod(GSS)
    (container,) = pod["spec"]["containers"]
    assert set(container["resources"]) == {"limits"} and "cpu" not in container["resources"]["limits"]
    assert "volumes" not in pod["spec"] and "volumeMounts" not in container


def test_contract_cpu_and_memory_match_the_crd_schema():
    jsonschema.validate({k: v for k, v in with_resources().items() if k != "metadata"}, crd_schema())


@pytest.mark.parametrize(("field", "value"), [("cpuMillicores", 0), ("cpuMillicores", "4"), ("memoryMiB", 0), ("memoryMiB", 1.5)])
def test_crd_schema_refuses_bad_cpu_and_memory(field, value):
    body = {"apiVersion": GSS["apiVersion"], "kind": GSS["kind"], "spec": {**GSS["spec"], field: value}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, crd_schema())
