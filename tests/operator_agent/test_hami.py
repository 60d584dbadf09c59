"""Decoding of every HAMi node-registration fixture (tests/fixtures/hami/, provenance in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from operator_agent.hami import (
    HamiDecodeError,
    HamiDevice,
    decode_node_register,
    node_register_annotation,
    strip_model_prefix,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hami"

# The 8× H100 of HAMi issue #961, in annotation order, with their NVML index.
H100_UUIDS_AND_INDEX = [
    ("GPU-c3699744-0b88-6a13-641d-4f12bed5c1e0", 6),
    ("GPU-f33046e8-f8ce-e356-9bd5-dc371cd3440c", 7),
    ("GPU-d5ce9128-646c-649e-3008-e1eaf764f229", 0),
    ("GPU-31518e05-67f8-316e-6bce-e010baa1cc88", 1),
    ("GPU-994fe2ef-c8c0-a723-e6f9-67dcc3ca7164", 2),
    ("GPU-084020d3-3b49-b252-c6dd-9351a72bc7b1", 3),
    ("GPU-a3efefa9-8d9e-fcd7-eb38-dee51143d163", 4),
    ("GPU-33b5739b-85b3-4279-071b-380e4f936328", 5),
]
H100_UUIDS = [uuid for uuid, _ in H100_UUIDS_AND_INDEX]
H100_MODEL = "NVIDIA H100 80GB HBM3"

H100_FIXTURES = {
    # file: (encoding, index carried by the encoding, mode)
    "node-nvidia-register.v2.5-v2.7.legacy9.h100x8.txt": ("legacy9", True, "hami-core"),
    "node-nvidia-register.v2.3-v2.4.legacy7.h100x8.derived.txt": ("legacy7", False, None),
    "node-nvidia-register.4pd-v2.3.legacy6.h100x8.derived.txt": ("legacy6", False, None),
    "node-nvidia-register.v2.8-v2.9.json.h100x8.derived.json": ("json", True, "hami-core"),
    "node-nvidia-register.v2.10.json.h100x8.derived.json": ("json", True, "hami-core"),
}


def load(name: str) -> str:
    """Return a fixture's raw annotation value."""
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_register_fixture_is_covered():
    """A new node-register fixture must get expectations here."""
    covered = set(H100_FIXTURES) | {
        "node-nvidia-register.v2.5-v2.7.legacy9.h20x8-mig-scaled.txt",
        "node-nvidia-register.v2.4.legacy7.t4x1.txt",
        "node-nvidia-register.v2.10.json.v100x2.doc.json",
        "node-nvidia-register.v2.10.json.mig.testfixture.json",
    }
    assert {p.name for p in FIXTURES.glob("node-nvidia-register.*")} == covered


# --------------------------------------------------------------------------- 8× H100 in every format


@pytest.mark.parametrize("name", sorted(H100_FIXTURES))
def test_h100x8_fixture(name):
    encoding, has_index, mode = H100_FIXTURES[name]
    devices = decode_node_register(load(name))

    assert [d.uuid for d in devices] == H100_UUIDS  # annotation order is kept
    for position, device in enumerate(devices):
        assert device.model == H100_MODEL
        assert device.memory_mib == 81559
        assert device.split_count == 10
        assert device.cores == 100
        assert device.numa == 0
        assert device.health is True
        assert device.mode == mode
        assert device.encoding == encoding
        expected_index = H100_UUIDS_AND_INDEX[position][1] if has_index else position
        assert device.index == expected_index


def test_h100x8_same_devices_in_every_format():
    """The DERIVED fixtures are the same node: everything but mode/index/encoding must agree."""

    def essentials(device: HamiDevice) -> tuple:
        return (device.uuid, device.model, device.memory_mib, device.split_count, device.cores, device.health)

    decoded = {name: decode_node_register(load(name)) for name in H100_FIXTURES}
    reference = sorted(essentials(d) for d in decoded["node-nvidia-register.v2.5-v2.7.legacy9.h100x8.txt"])
    for devices in decoded.values():
        assert sorted(essentials(d) for d in devices) == reference
    indexed = [devices for name, devices in decoded.items() if H100_FIXTURES[name][1]]
    for devices in indexed:
        assert {d.uuid: d.index for d in devices} == dict(H100_UUIDS_AND_INDEX)


def test_legacy9_index_order_is_not_position():
    devices = decode_node_register(load("node-nvidia-register.v2.5-v2.7.legacy9.h100x8.txt"))
    assert [d.index for d in devices] == [6, 7, 0, 1, 2, 3, 4, 5]


def test_json_v2_10_missing_index_means_zero():
    devices = decode_node_register(load("node-nvidia-register.v2.10.json.h100x8.derived.json"))
    by_uuid = {d.uuid: d for d in devices}
    assert by_uuid["GPU-d5ce9128-646c-649e-3008-e1eaf764f229"].index == 0
    assert sorted(d.index for d in devices) == list(range(8))


# --------------------------------------------------------------------------- other real / doc / test values


def test_h20x8_mig_scaled():
    devices = decode_node_register(load("node-nvidia-register.v2.5-v2.7.legacy9.h20x8-mig-scaled.txt"))
    assert len(devices) == 8
    assert len({d.uuid for d in devices}) == 8
    assert devices[0].uuid == "GPU-40c0923a-6172-5f3c-d299-4f6eaf218ad5"
    assert devices[-1].uuid == "GPU-c6a9ed1a-e4f8-f17b-845b-7c76ba095a82"
    assert [d.index for d in devices] == [1, 2, 3, 4, 5, 6, 7, 0]
    for device in devices:
        assert device.model == "NVIDIA H20-3e"
        assert device.memory_mib == 258787  # deviceMemoryScaling 1.8: more than the physical 143771 MiB
        assert device.cores == 500  # over-subscribed: five times one GPU
        assert device.split_count == 10
        assert device.mode == "mig"
        assert device.health is True
        assert device.numa == 0
        assert device.encoding == "legacy9"


def test_t4x1_legacy7():
    devices = decode_node_register(load("node-nvidia-register.v2.4.legacy7.t4x1.txt"))
    assert devices == [
        HamiDevice(
            uuid="GPU-9a3603f4-f66e-d48b-11ea-13e327064cca",
            index=0,
            model="Tesla T4",
            memory_mib=15360,
            split_count=10,
            cores=100,
            numa=0,
            health=True,
            mode=None,
            encoding="legacy7",
        )
    ]


def test_v100x2_doc_json():
    devices = decode_node_register(load("node-nvidia-register.v2.10.json.v100x2.doc.json"))
    assert [d.uuid for d in devices] == [
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec",
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
    ]
    assert [d.index for d in devices] == [0, 1]  # first element lacks "index" (omitempty)
    for device in devices:
        assert device.model == "Tesla V100-PCIE-32GB"
        assert device.memory_mib == 32768
        assert device.split_count == 10
        assert device.cores == 100
        assert device.numa == 1
        assert device.health is True
        assert device.mode == "hami-core"
        assert device.encoding == "json"


def test_mig_testfixture_json_ignores_unknown_keys():
    devices = decode_node_register(load("node-nvidia-register.v2.10.json.mig.testfixture.json"))
    assert devices == [
        HamiDevice(
            uuid="GPU-0",
            index=0,
            model="A100-SXM4-40GB",  # HAMi's test writes the prefix with a dash: one "NVIDIA-" is removed
            memory_mib=40960,
            split_count=7,
            cores=100,
            numa=0,
            health=True,
            mode="mig",
            encoding="json",
        )
    ]


# --------------------------------------------------------------------------- encodings without a fixture


def test_legacy5_v2_2_9():
    value = "GPU-aaaa,10,15360,NVIDIA-Tesla T4,true:GPU-bbbb,5,15360,NVIDIA-Tesla T4,false:"
    first, second = decode_node_register(value)
    assert (first.uuid, first.index, first.split_count) == ("GPU-aaaa", 0, 10)
    assert (first.memory_mib, first.cores) == (15360, 100)  # legacy5 has no devcore: one whole GPU
    assert (first.model, first.health, first.mode, first.numa, first.encoding) == ("Tesla T4", True, None, 0, "legacy5")
    assert (second.uuid, second.index, second.split_count, second.health) == ("GPU-bbbb", 1, 5, False)


def test_json_omitempty_defaults():
    value = '[{"id":"GPU-0","count":1,"type":"NVIDIA-Tesla T4","devicepairscore":{},"custominfo":{"x":1}}]'
    (device,) = decode_node_register(value)
    assert device == HamiDevice(
        uuid="GPU-0",
        index=0,
        model="Tesla T4",
        memory_mib=0,
        split_count=1,
        cores=0,
        numa=0,
        health=False,  # "health" absent = unhealthy
        mode=None,
        encoding="json",
    )


def test_go_parsebool_spellings():
    value = "GPU-a,10,1,100,T,0,1:GPU-b,10,1,100,T,0,F:GPU-c,10,1,100,T,0,TRUE:"
    assert [d.health for d in decode_node_register(value)] == [True, False, True]


@pytest.mark.parametrize("value", ["", "   ", "\n", "[]"])
def test_empty_values_mean_no_gpus(value):
    assert decode_node_register(value) == []


def test_surrounding_whitespace_is_ignored():
    value = load("node-nvidia-register.v2.4.legacy7.t4x1.txt")
    assert decode_node_register(value + "\n") == decode_node_register(value)


def test_empty_legacy_records_are_skipped():
    devices = decode_node_register("GPU-a,10,1,100,T,0,true::GPU-b,10,1,100,T,0,true:")
    assert [(d.uuid, d.index) for d in devices] == [("GPU-a", 0), ("GPU-b", 1)]


# --------------------------------------------------------------------------- malformed input

T4 = "GPU-9a3603f4-f66e-d48b-11ea-13e327064cca,10,15360,100,NVIDIA-Tesla T4,0,true"
GPU0 = '{"id":"GPU-0","count":1,"type":"T"}'


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        # 8-field records of the unreleased commit 68d90378
        (f"{T4},3:", ["record 0", "GPU-9a3603f4", "8-field", "not supported"]),
        ("GPU-a,10,1,T:", ["record 0", "GPU-a", "got 4"]),
        (f"{T4}:GPU-b,10,1,100,T,0,true,1,hami-core,extra:", ["record 1", "GPU-b", "got 10"]),
        (T4, ["record 0", "not terminated"]),
        (f"{T4}:GPU-b,10,1,100", ["record 1", "not terminated"]),
        ("GPU-a,ten,15360,100,NVIDIA-Tesla T4,0,true:", ["record 0", "GPU-a", "count", "'ten'"]),
        ("GPU-a,10,15360,100,NVIDIA-Tesla T4,0,maybe:", ["GPU-a", "health", "'maybe'"]),
        ("GPU-a,10,15360,100,NVIDIA-Tesla T4,0,true,-1,hami-core:", ["GPU-a", "index", "between 0"]),
        ("GPU-a,0,15360,100,NVIDIA-Tesla T4,0,true:", ["GPU-a", "count", "between 1"]),
        ("GPU-a,10,2147483648,100,NVIDIA-Tesla T4,0,true:", ["GPU-a", "devmem", "2147483647"]),
        ("GPU-a,10,15360,100,,0,true:", ["GPU-a", "empty type"]),
        ("GPU-a,10,15360,100,NVIDIA-,0,true:", ["GPU-a", "empty type"]),
        (",10,15360,100,NVIDIA-Tesla T4,0,true:", ["record 0", "empty GPU UUID"]),
        (f"{T4}:{T4}:", ["device 1", "GPU-9a3603f4", "more than once"]),
        ("GPU-a,10,1,100,T,0,true:GPU-b,10,1,100,T,0,true:GPU-a,10,1,100,T,0,true:", ["device 2", "GPU-a"]),
        ("[{", ["not valid JSON"]),
        ('{"id":"GPU-0"}', ["must be an array", "dict"]),
        ('["GPU-0"]', ["record 0", "expected a JSON object"]),
        ('[{"id":"GPU-0","count":1,"type":"T"},{"count":10}]', ["record 1", '"id"']),
        ('[{"id":"GPU-0","count":1,"type":"T","index":"1"}]', ["record 0 (GPU-0)", '"index"', "integer"]),
        ('[{"id":"GPU-0","count":1,"type":"T","devmem":1.5}]', ["GPU-0", '"devmem"']),
        ('[{"id":"GPU-0","count":true,"type":"T"}]', ["GPU-0", '"count"']),
        ('[{"id":"GPU-0","type":"T"}]', ["GPU-0", '"count"', "between 1"]),  # omitted count = 0
        ('[{"id":"GPU-0","count":1,"type":"T","index":-2}]', ["GPU-0", '"index"', "between 0"]),
        ('[{"id":"GPU-0","count":1,"type":"T","devcore":4294967296}]', ["GPU-0", '"devcore"', "2147483647"]),
        ('[{"id":"GPU-0","count":1,"type":"T","health":"true"}]', ["GPU-0", '"health"', "boolean"]),
        ('[{"id":"GPU-0","count":1,"type":7}]', ["GPU-0", '"type"']),
        ('[{"id":"GPU-0","count":1}]', ["GPU-0", '"type"', "empty"]),
        ('[{"id":"GPU-0","count":1,"type":"T","mode":1}]', ["GPU-0", '"mode"']),
        (f"[{GPU0},{GPU0}]", ["device 1", "GPU-0", "more than once"]),
    ],
)
def test_malformed_values_name_the_record(value, fragments):
    with pytest.raises(HamiDecodeError) as excinfo:
        decode_node_register(value)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_decode_error_is_a_value_error():
    assert issubclass(HamiDecodeError, ValueError)
    with pytest.raises(ValueError):
        decode_node_register("garbage")


def test_non_string_value_is_refused():
    with pytest.raises(HamiDecodeError, match="string"):
        decode_node_register(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("hami_type", "model"),
    [
        ("NVIDIA-NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA-Tesla T4", "Tesla T4"),
        ("NVIDIA-NVIDIA-odd", "NVIDIA-odd"),  # a single prefix only
        ("", ""),
    ],
)
def test_strip_model_prefix(hami_type, model):
    assert strip_model_prefix(hami_type) == model


def test_node_register_annotation_prefers_hami_key():
    annotations = {"4pd.io/node-nvidia-register": "old", "hami.io/node-nvidia-register": "new"}
    assert node_register_annotation(annotations) == "new"


def test_node_register_annotation_falls_back_to_4pd_key():
    value = load("node-nvidia-register.4pd-v2.3.legacy6.h100x8.derived.txt")
    annotations = {"4pd.io/node-nvidia-register": value, "hami.io/node-handshake": "Requesting_2024.03.13 14:41:43"}
    assert node_register_annotation(annotations) == value
    assert len(decode_node_register(node_register_annotation(annotations))) == 8


@pytest.mark.parametrize("annotations", [None, {}, {"hami.io/node-handshake": "Reported 2025-03-27"}])
def test_node_register_annotation_absent(annotations):
    assert node_register_annotation(annotations) is None


def test_device_is_frozen():
    (device,) = decode_node_register(load("node-nvidia-register.v2.4.legacy7.t4x1.txt"))
    with pytest.raises(AttributeError):
        device.uuid = "GPU-other"  # type: ignore[misc]
