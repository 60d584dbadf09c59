"""GPU models on a session request: names matched to the fleet's models, placement on those only, the API's answers."""

from decimal import Decimal

import pytest

from billing import services as billing
from billing.exceptions import InsufficientCredits
from billing.models import Price
from clusters.models import GpuDevice
from console.pages.sessions.actions import StartSessionForm
from core.exceptions import Conflict
from operator_agent.manifests.session import session_pod
from sessions import create, placement
from sessions.gpu_models import GpuModelUnknown, gpu_models_overmatched, gpu_models_problem, gpu_models_resolve, hami_gpu_uuids, name_matches
from sessions.lifecycle.remote import session_for_apply
from sessions.manifests import gshare_session_manifest
from sessions.models import Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

H100 = "NVIDIA H100 80GB HBM3"
V100 = "Tesla V100-PCIE-32GB"
A100 = "NVIDIA A100-SXM4-80GB"
A10 = "NVIDIA A10"

# --------------------------------------------------------------------------- matching (no database)


@pytest.mark.parametrize(
    ("name", "model", "matches"),
    [
        ("H100", H100, True), ("h100", H100, True), ("  h100 ", H100, True), (H100, H100, True), (H100.lower(), H100, True),
        ("h100 80gb", H100, True), ("H100-80GB", H100, True), ("80GB HBM3", H100, True), ("NVIDIA", H100, True),
        ("H10", H100, False), ("100", H100, False), ("HBM3 80GB", H100, False), ("H100 HBM3", H100, False),
        ("A10", A100, False), ("a10", A100, False), ("A100", A100, True), ("a100-sxm4", A100, True), ("A10", A10, True),
        ("V100", V100, True), ("tesla v100", V100, True), ("V100-PCIE-32GB", V100, True), ("V10", V100, False),
        ("---", H100, False),
    ],
)
def test_a_name_matches_a_model_equal_or_by_whole_words_ignoring_case(name, model, matches):
    assert name_matches(name, model) is matches


def test_an_alias_matching_several_models_accepts_each_and_a10_never_takes_a100():
    fleet_models = [A10, A100, H100, "NVIDIA H100-SXM5-80GB", V100]
    assert gpu_models_resolve(["h100"], fleet=fleet_models) == [H100, "NVIDIA H100-SXM5-80GB"]
    assert gpu_models_resolve(["A10"], fleet=fleet_models) == [A10]
    assert gpu_models_resolve(["a100", "A10", "A100"], fleet=fleet_models) == [A10, A100]
    assert gpu_models_resolve([], fleet=fleet_models) == []


def test_an_unknown_name_is_refused_with_the_fleets_models():
    with pytest.raises(GpuModelUnknown) as info:
        gpu_models_resolve(["H100", "A10"], fleet=[A100, H100])
    error = info.value
    assert (error.status, error.code) == (400, "gpu_model_unknown")
    assert "'A10'" in error.detail and A100 in error.detail and H100 in error.detail
    assert error.extra == {"unknown": ["A10"], "available": [A100, H100]}


@pytest.mark.parametrize(
    "value",
    ["H100", {"H100": 1}, 7, None, [1], [None], [["H100"]], [""], ["   "], ["x" * 129], ["H\n100"], ["---"], ["H100"] * 17],
    ids=["string", "object", "number", "null", "number-entry", "null-entry", "nested", "empty", "blank", "long", "control",
         "no-word", "too-many"],
)
def test_malformed_gpu_models_are_described(value):
    assert gpu_models_problem(value)


@pytest.mark.parametrize("value", [[], ["H100"], ["x" * 128], ["H100"] * 16, ("A100",)])
def test_well_formed_gpu_models_pass(value):
    assert gpu_models_problem(value) is None


# --------------------------------------------------------------------------- placement


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice")


def two_model_cluster():
    """One cluster: node n-a100 (2 × A100) and node n-a10 (2 × A10), every GPU shareable by 4."""
    cluster = ClusterFactory()
    for node_name, model in (("n-a100", A100), ("n-a10", A10)):
        node = NodeFactory(cluster=cluster, name=node_name)
        for i in range(2):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, model=model, split_count=4, memory_mib=16000, cores=100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


@pytest.mark.django_db
def test_placement_takes_only_gpus_of_the_accepted_models(user):
    two_model_cluster()
    first = create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10"])
    assert first.gpu_models == [A10] and first.node == "n-a10"
    assert {a.device.model for a in first.allocations.select_related("device")} == {A10}
    share = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10, gpu_models=["a100"])
    assert share.gpu_models == [A100] and share.node == "n-a100"
    create.session_create(owner=user, image="img", gpus=1, gpu_models=[A10.lower()])
    # Both A10s are taken: the A100s still free do not count for an A10 request.
    with pytest.raises(Conflict) as info:
        create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10"])
    assert info.value.code == "no_capacity"
    assert A10 in info.value.detail and "2 healthy GPU(s) on ready nodes, 0 with nothing on them" in info.value.detail
    # Any model, or either model, still fits.
    assert create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10", "A100"]).node == "n-a100"
    anywhere = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10)  # beside the A100 share
    assert anywhere.gpu_models == [] and anywhere.node == "n-a100"


@pytest.mark.django_db
def test_an_unknown_model_creates_nothing(user):
    two_model_cluster()
    with pytest.raises(GpuModelUnknown):
        create.session_create(owner=user, image="img", gpus=1, gpu_models=["H100"])
    assert Session.objects.count() == 0


def test_a_request_without_models_keeps_the_fit_query_it_had():
    sql, params = placement.fit_query(request=placement.Request(gpus=1), cluster_ids=None, policy="binpack")
    assert "model" not in sql and "models" not in params
    sql, params = placement.fit_query(request=placement.Request(gpus=1, models=(A10,)), cluster_ids=None, policy="binpack")
    assert "d.model = ANY(%(models)s::text[])" in sql and params["models"] == [A10]


# --------------------------------------------------------------------------- the API, on the emulated demo cluster

GSS = ("gsharesessions", "gshare.io", "v1alpha1")


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})


@pytest.mark.django_db
@pytest.mark.parametrize(("asked", "node"), [(["V100"], "gpu-v100-01"), (["tesla v100-pcie-32gb"], "gpu-v100-01"),
                                              (["h100"], "gpu-h100-01")])
def test_api_places_on_the_asked_model_and_the_manifest_carries_it(http, live_cluster, asked, node):
    _, emulated = live_cluster("lab-c1")
    response = start(http, gpu_models=asked)
    assert response.status_code == 201, response.text
    body = response.json()
    model = V100 if node == "gpu-v100-01" else H100
    assert body["gpu_models"] == [model] and body["node"] == node
    (gss,) = emulated.objects_of(*GSS)
    assert gss["spec"]["gpuModels"] == [model]
    assert http.get(f"/api/v1/sessions/{body['id']}").json()["gpu_models"] == [model]


@pytest.mark.django_db
def test_api_without_models_is_unchanged(http, live_cluster):
    _, emulated = live_cluster("lab-c1")
    body = start(http).json()
    assert body["gpu_models"] == []
    (gss,) = emulated.objects_of(*GSS)
    assert "gpuModels" not in gss["spec"]
    assert start(http, gpu_models=[]).json()["gpu_models"] == []


@pytest.mark.django_db
@pytest.mark.parametrize("asked", [["A100"], ["H100", "A10"], ["H10"]])
def test_api_unknown_model_is_400_naming_the_fleets_models(http, live_cluster, asked):
    live_cluster("lab-c1")
    response = start(http, gpu_models=asked)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "gpu_model_unknown"
    assert H100 in body["detail"] and V100 in body["detail"]
    assert body["available"] == [H100, V100]
    assert Session.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value",
    ["H100", {"model": "H100"}, 100, True, None, [100], [True], [None], [["H100"]], [{"m": 1}], [""], ["x" * 129],
     ["H100"] * 17, ["---"]],
)
def test_api_hostile_gpu_models_are_invalid_requests(http, live_cluster, value):
    live_cluster("lab-c1")
    response = start(http, gpu_models=value)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request"
    assert "gpu_models" in response.text
    assert Session.objects.count() == 0


@pytest.mark.django_db
def test_api_no_capacity_for_the_asked_model_while_others_are_free(http, live_cluster):
    live_cluster("lab-c1")
    assert start(http, gpus=2, gpu_models=["V100"]).status_code == 201
    response = start(http, gpus=1, gpu_models=["V100"])
    assert response.status_code == 409 and response.json()["code"] == "no_capacity"
    assert start(http, gpus=1, gpu_models=["V100", "H100"]).json()["node"] == "gpu-h100-01"


@pytest.mark.django_db
def test_admission_prices_the_request_at_its_accepted_models(user, settings):
    """Admission prices a request at the dearest model it could land on: only the accepted ones when it names some."""
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = Decimal(1)
    two_model_cluster()
    Price.objects.create(gpu_model=A100, credits_per_gpu_hour=Decimal(10))
    Price.objects.create(gpu_model=A10, credits_per_gpu_hour=Decimal(1))
    billing.credit_grant(user=user, amount=Decimal(5), reason="test", idempotency_key="grant-1", created_by="test")
    with pytest.raises(InsufficientCredits):
        create.session_create(owner=user, image="img", gpus=1)
    assert create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10"]).node == "n-a10"


# --------------------------------------------------------------------------- HAMi's substring match on the cluster


def hami_admits(annotations: dict, model: str, uuid: str) -> bool:
    """HAMi v2.x's ``checkGPUtype`` (an entry contained in the upper-cased type ``NVIDIA-<model>``; with
    ``use-gputype`` set, ``nouse-gputype`` is not read) and ``CheckUUID`` (exact) for one GPU."""
    device_type = f"NVIDIA-{model}".upper()
    types = annotations.get("nvidia.com/use-gputype")
    if types is not None and not any(entry.upper() in device_type for entry in types.split(",")):
        return False
    uuids = annotations.get("nvidia.com/use-gpuuuid")
    return uuids is None or uuid in uuids.split(",")


@pytest.mark.parametrize(
    ("accepted", "models", "over"),
    [([A10], [A10, A100], [A100]), (["NVIDIA L4"], ["NVIDIA L4", "NVIDIA L40S"], ["NVIDIA L40S"]), ([A100], [A10, A100], []),
     ([A10, A100], [A10, A100], []), ([H100], [H100, "NVIDIA H100-SXM5-80GB"], []), ([A10], [A10], [])],
)
def test_models_hamis_type_annotation_would_also_give(accepted, models, over):
    assert gpu_models_overmatched(accepted, models) == over


@pytest.mark.django_db
def test_an_a10_session_on_a_node_pool_with_a100s_is_pinned_to_the_a10s_on_the_cluster(user, django_assert_num_queries):
    """Placement reserves an A10 and prices it as one, but HAMi's ``use-gputype: NVIDIA A10`` alone also takes the
    dearer A100s: the GShareSession then lists the A10s' UUIDs, which the pod carries as ``use-gpuuuid``."""
    cluster = two_model_cluster()
    session = create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10"])
    with django_assert_num_queries(2):
        uuids = hami_gpu_uuids(cluster_id=cluster.pk, models=session.gpu_models)
    gpus = list(GpuDevice.objects.filter(cluster=cluster).values_list("model", "uuid"))
    assert uuids == sorted(uuid for model, uuid in gpus if model == A10) and len(uuids) == 2
    manifest = gshare_session_manifest(session_for_apply(session.pk), gpu_uuids=uuids)
    assert manifest["spec"]["gpuUuids"] == uuids
    annotations = session_pod({**manifest, "metadata": {**manifest["metadata"], "uid": "u-1"}})["metadata"]["annotations"]
    assert {model for model, uuid in gpus if hami_admits(annotations, model, uuid)} == {A10}
    # Without the UUIDs HAMi would also take the A100s: the hazard this guards against.
    assert {model for model, uuid in gpus if hami_admits({"nvidia.com/use-gputype": A10}, model, uuid)} == {A10, A100}


@pytest.mark.django_db
def test_a_session_whose_models_no_other_model_contains_needs_no_uuids(user, django_assert_num_queries):
    cluster = two_model_cluster()
    with django_assert_num_queries(1):
        assert hami_gpu_uuids(cluster_id=cluster.pk, models=[A100]) == []
    with django_assert_num_queries(0):
        assert hami_gpu_uuids(cluster_id=cluster.pk, models=[]) == []
    session = create.session_create(owner=user, image="img", gpus=1, gpu_models=["A100"])
    assert "gpuUuids" not in gshare_session_manifest(session_for_apply(session.pk))["spec"]


# --------------------------------------------------------------------------- hostile names, races, the console form


@pytest.mark.parametrize(
    ("name", "expected"),
    [("A10,A100", None), ("NVIDIA A10,NVIDIA A100-SXM4-80GB", None), ("A10\u2028A100", "malformed"), ("A\u200b10", "malformed"),
     ("ß", "malformed"), ("ﬀ", "malformed"), ("Ａ10", None), ("A10'; --", [A10]), ("nvidia a10", [A10]), ("NVIDIA A10 " * 3, None),
     ("NVIDIA*", [A10, A100, H100]), ("%", "malformed")],
)
def test_a_hostile_name_resolves_to_fleet_models_only(name, expected):
    """The annotation carries the resolved fleet names, never the asked text: a comma, a control or zero-width
    character, a ligature or a full-width letter never joins two models or reaches another model's name (``None``:
    ``gpu_model_unknown``)."""
    if expected == "malformed":
        assert gpu_models_problem([name])
        return
    assert gpu_models_problem([name]) is None
    if expected is None:
        with pytest.raises(GpuModelUnknown):
            gpu_models_resolve([name], fleet=[A10, A100, H100])
    else:
        assert gpu_models_resolve([name], fleet=[A10, A100, H100]) == expected


@pytest.mark.django_db
def test_a_model_gone_between_resolve_and_placement_is_no_capacity_and_creates_nothing(user, monkeypatch):
    """The A10 node leaves after the names were resolved (no lock between): placement finds no A10 and answers
    ``no_capacity``, never an A100."""
    cluster = two_model_cluster()
    fleet = ["NVIDIA A10", A100]

    def fleet_then_gone():
        GpuDevice.objects.filter(cluster=cluster, model=A10).delete()
        placement.usage_recompute(cluster_ids=[cluster.pk])
        return fleet

    monkeypatch.setattr("sessions.gpu_models.fleet_gpu_models", fleet_then_gone)
    with pytest.raises(Conflict) as info:
        create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10"])
    assert info.value.code == "no_capacity"
    assert Session.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(("models", "code"), [(["A10"] * 300, "invalid_request"), (["H100"], "gpu_model_unknown"),
                                               (["x" * 129], None)])
def test_console_form_with_forged_models_is_refused_and_creates_nothing(user, models, code):
    """A forged POST (hundreds of values, a model the fleet lacks, a name too long) gets the service's refusal or a
    field error, never a session."""
    two_model_cluster()
    form = StartSessionForm(data={"image": "img", "gpus": 1, "share": "whole", "gpu_models": models, "idempotency_key": "k-1"},
                            owner=user)
    assert form.start() is None
    if code is None:
        assert "gpu_models" in form.errors
    else:
        assert form.refusal is not None and form.refusal.code == code
    assert Session.objects.count() == 0


@pytest.mark.django_db
def test_resolving_reads_the_fleets_models_in_one_query_and_none_for_any_model(django_assert_num_queries):
    two_model_cluster()
    with django_assert_num_queries(1):
        assert gpu_models_resolve(["A10", "a100", "NVIDIA"] * 5) == [A10, A100]
    with django_assert_num_queries(0):
        assert gpu_models_resolve([]) == []


@pytest.mark.django_db
def test_admission_prices_several_accepted_models_at_the_dearest(user, settings):
    """Accepting a cheap and a dear model is priced as the dear one, even while the cheap one has room."""
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = Decimal(1)
    two_model_cluster()
    Price.objects.create(gpu_model=A100, credits_per_gpu_hour=Decimal(10))
    Price.objects.create(gpu_model=A10, credits_per_gpu_hour=Decimal(1))
    billing.credit_grant(user=user, amount=Decimal(5), reason="test", idempotency_key="grant-1", created_by="test")
    with pytest.raises(InsufficientCredits):
        create.session_create(owner=user, image="img", gpus=1, gpu_models=["A10", "A100"])
    assert Session.objects.count() == 0
