"""`hack/cluster-bootstrap.sh prereqs` on a fake node: real os-release files of each family (tests/fixtures/os-release),
a root folder standing in for the node's / (GSHARE_BOOTSTRAP_ROOT), and a PATH holding only the real tools the script
needs plus stand-ins for the package managers and NVIDIA's tools, which record every call."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from attach.checks import CONTAINERD_CONFIGS
from tests.helpers import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "cluster-bootstrap.sh"
OS_RELEASE = FIXTURES / "os-release"
KERNEL = os.uname().release
ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(os.uname().machine, "")
CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"
TOOLKIT = "https://nvidia.github.io/libnvidia-container"
# The real tools the script runs (everything else it needs is a shell builtin of dash and BusyBox sh).
TOOLS = ("sed", "grep", "cat", "uname", "tr", "dirname")
RECORD = 'printf "%s\\n" "$(basename "$0") $*" >> "$GSHARE_TEST_LOG"\n'

pytestmark = pytest.mark.skipif(not ARCH, reason=f"NVIDIA publishes no repository for {os.uname().machine}")


class Node:
    """A fake node: ``root`` (its /), ``bin`` (its PATH) and the log of the commands that changed something."""

    def __init__(self, tmp_path: Path, *, gpus: int = 1, root_user: bool = True):
        self.root, self.bin, self.log = tmp_path / "node", tmp_path / "bin", tmp_path / "commands.log"
        self.bin.mkdir()
        self.log.write_text("")
        for tool in TOOLS + ("mkdir", "chmod", "basename"):
            (self.bin / tool).symlink_to(shutil.which(tool))
        for index in range(gpus):
            self.pci(f"0000:{0x3b + index:02x}:00.0", "0x10de", "0x030200")
        self.pci("0000:00:02.0", "0x8086", "0x030000")  # the board's own graphics: not an NVIDIA GPU
        self.fake("id", 'echo 0' if root_user else 'echo 1000', record=False)

    def pci(self, address: str, vendor: str, klass: str) -> None:
        device = self.root / "sys/bus/pci/devices" / address
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(klass + "\n")

    def fake(self, name: str, body: str = "", *, record: bool = True) -> None:
        path = self.bin / name
        path.write_text("#!/bin/sh\n" + (RECORD if record else "") + body + "\n")
        path.chmod(0o755)

    def package_manager(self, name: str) -> None:
        """``apt-get``/``dnf`` whose ``install`` puts in place what the real packages provide."""
        # The driver's nvidia-smi before the reboot: the kernel module is not loaded yet.
        self.fake(".nvidia-smi-unloaded", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9",
                  record=False)
        self.fake(".mount.nfs", record=False)
        self.fake(name, f"""[ "$1" = install ] || exit 0
for package in "$@"; do
  case $package in
    nvidia-open) cp "{self.bin}/.nvidia-smi-unloaded" "{self.bin}/nvidia-smi" ;;
    nvidia-container-toolkit) cp "{self.bin}/.nvidia-ctk" "{self.bin}/nvidia-ctk" ;;
    nfs-common | nfs-utils) mkdir -p "$GSHARE_BOOTSTRAP_ROOT/sbin" && cp "{self.bin}/.mount.nfs" "$GSHARE_BOOTSTRAP_ROOT/sbin/mount.nfs" ;;
  esac
done""")

    def standard_fakes(self, manager: str = "apt-get") -> None:
        (self.bin / "cp").symlink_to(shutil.which("cp"))
        self.package_manager(manager)
        for name in ("dpkg", "systemctl", "subscription-manager", "containerd"):
            self.fake(name)
        self.fake("curl", """out="" url=""
while [ $# -gt 0 ]; do case $1 in -o) out=$2; shift 2 ;; -*) shift ;; *) url=$1; shift ;; esac; done
mkdir -p "$(dirname "$out")"
case $url in
  *.list) echo 'deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /' > "$out" ;;
  *) echo "downloaded from $url" > "$out" ;;
esac""")
        # What the toolkit package installs: nvidia-ctk, whose `runtime configure` writes containerd's config.
        ctk = self.bin / ".nvidia-ctk"
        ctk.write_text("""#!/bin/sh
case $1 in
  --version) echo "NVIDIA Container Toolkit CLI version 1.17.8"; exit 0 ;;
esac
""" + RECORD + """config="$GSHARE_BOOTSTRAP_ROOT/etc/containerd/config.toml"
mkdir -p "$(dirname "$config")"
printf '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\\n  runtime_type = "io.containerd.runc.v2"\\n' >> "$config"
""")
        ctk.chmod(0o755)

    def working_driver(self) -> None:
        """The node after its reboot: nvidia-smi -L lists the GPUs."""
        listing = FIXTURES / "nvidia-smi" / "h100-80gb-hbm3-mig.list-L.txt"
        self.fake("nvidia-smi", f'cat "{listing}"', record=False)

    def run(self, *args: str, os_release: str = "ubuntu-24.04") -> subprocess.CompletedProcess:
        env = {"PATH": str(self.bin), "GSHARE_BOOTSTRAP_ROOT": str(self.root), "GSHARE_TEST_LOG": str(self.log),
               "GSHARE_BOOTSTRAP_OS_RELEASE": str(OS_RELEASE / os_release)}
        return subprocess.run(["/bin/sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)

    def commands(self) -> list[str]:
        return self.log.read_text().splitlines()


def printed_commands(stdout: str) -> list[str]:
    """The command lines a run printed (indented by eight spaces under a step)."""
    return [line[8:] for line in stdout.splitlines() if line.startswith("        ")]


def debian_commands(root: Path, distro: str) -> list[str]:
    keyring = f"{root}/var/cache/apt/archives/cuda-keyring_1.1-1_all.deb"
    toolkit_list = f"{root}/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    return [
        "apt-get update",
        f"apt-get install -y linux-headers-{KERNEL} curl ca-certificates",
        f"curl -fsSL -o {keyring} {CUDA}/{distro}/{ARCH}/cuda-keyring_1.1-1_all.deb",
        f"dpkg -i {keyring}",
        "apt-get update",
        "apt-get install -y nvidia-open",
        f"curl -fsSL -o {root}/usr/share/keyrings/nvidia-container-toolkit-keyring.asc {TOOLKIT}/gpgkey",
        f"curl -fsSL -o {toolkit_list} {TOOLKIT}/stable/deb/nvidia-container-toolkit.list",
        "sed -i 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] https://#' "
        f"{toolkit_list}",
        "apt-get update",
        "apt-get install -y nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=containerd",
        "systemctl restart containerd",
        "apt-get install -y nfs-common",
    ]


def rhel_commands(root: Path, distro: str, epel: list[str]) -> list[str]:
    return [
        f"dnf install -y dnf-plugins-core kernel-devel-{KERNEL} kernel-headers",
        *epel,
        f"dnf config-manager --add-repo {CUDA}/{distro}/{ARCH}/cuda-{distro}.repo",
        "dnf install -y nvidia-open",
        f"curl -fsSL -o {root}/etc/yum.repos.d/nvidia-container-toolkit.repo {TOOLKIT}/stable/rpm/nvidia-container-toolkit.repo",
        "dnf install -y nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=containerd",
        "systemctl restart containerd",
        "dnf install -y nfs-utils",
    ]


FAMILIES = {
    "ubuntu-24.04": ("Ubuntu 24.04.3 LTS", "debian", lambda root: debian_commands(root, "ubuntu2404")),
    "debian-12": ("Debian GNU/Linux 12 (bookworm)", "debian", lambda root: debian_commands(root, "debian12")),
    "debian-13": ("Debian GNU/Linux 13 (trixie)", "debian", lambda root: debian_commands(root, "debian13")),
    "rhel-9": ("Red Hat Enterprise Linux 9.6 (Plow)", "rhel", lambda root: rhel_commands(root, "rhel9", [
        f"subscription-manager repos --enable=codeready-builder-for-rhel-9-{os.uname().machine}-rpms",
        "dnf install -y https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm"])),
    "rocky-9": ("Rocky Linux 9.3 (Blue Onyx)", "rhel", lambda root: rhel_commands(root, "rhel9", [
        "dnf config-manager --set-enabled crb", "dnf install -y epel-release"])),
    "almalinux-10": ("AlmaLinux 10.0 (Purple Lion)", "rhel", lambda root: rhel_commands(root, "rhel10", [
        "dnf config-manager --set-enabled crb", "dnf install -y epel-release"])),
}


@pytest.mark.parametrize("os_release", sorted(FAMILIES))
def test_dry_run_prints_each_check_and_the_exact_commands_of_its_family_and_runs_none(tmp_path, os_release):
    name, family, expected = FAMILIES[os_release]
    node = Node(tmp_path, gpus=2, root_user=False)  # a dry run needs no root
    node.standard_fakes("apt-get" if family == "debian" else "dnf")
    (node.bin / "nvidia-ctk").unlink(missing_ok=True)

    run = node.run("prereqs", "--gpu", "--nfs", "--dry-run", os_release=os_release)

    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    manager = "apt-get" if family == "debian" else "dnf"
    assert lines[0] == (f"gShare node prerequisites on {name} ({family} family, {manager}; from {OS_RELEASE / os_release}), "
                        "dry run: nothing is changed")
    assert lines[1] == f"[1/5] NVIDIA GPUs: checked {node.root}/sys/bus/pci/devices (vendor 0x10de): 2 found"
    assert lines[2] == "[2/5] NVIDIA driver: checked nvidia-smi -L: nvidia-smi not found"
    assert "[3/5] NVIDIA Container Toolkit: checked nvidia-ctk --version: nvidia-ctk not found" in lines
    assert f"[4/5] containerd nvidia runtime: checked containerd's configuration ({node.root}/etc/containerd/config.toml, " \
           "conf.d/*.toml, k3s and RKE2's): no nvidia runtime" in lines
    assert "[5/5] NFS client: checked mount.nfs: not found" in lines
    assert printed_commands(run.stdout) == expected(node.root)
    assert lines[-2:] == ["dry run: 4 step(s) would change this node; run again without --dry-run, as root, to do it.",
                          "a reboot would be needed afterwards: the NVIDIA driver loads at boot."]
    assert node.commands() == []
    assert not (node.root / "etc").exists() and not (node.root / "var").exists()


@pytest.mark.parametrize("os_release,name,like", [
    ("alpine", "Alpine Linux v3.23", "ID=alpine in"),
    ("opensuse-leap-15", "openSUSE Leap 15.2", "ID=opensuse-leap, ID_LIKE=suse opensuse in"),
])
def test_an_unknown_family_stops_naming_what_to_install_by_hand(tmp_path, os_release, name, like):
    node = Node(tmp_path)
    node.standard_fakes()

    run = node.run("prereqs", "--gpu", "--nfs", "--dry-run", os_release=os_release)

    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"cluster-bootstrap.sh: {name} ({like} {OS_RELEASE / os_release}) is neither a "
                                 "Debian/Ubuntu nor a RHEL-family distribution, so nothing was changed. Install by hand:\n")
    assert "  - the NVIDIA driver, until nvidia-smi -L lists the GPUs" in run.stderr
    assert "  - the NVIDIA Container Toolkit, which provides nvidia-ctk" in run.stderr
    assert "nvidia-ctk runtime configure --runtime=containerd && systemctl restart containerd" in run.stderr
    assert "  - the NFS client, which provides mount.nfs" in run.stderr
    nfs_only = node.run("prereqs", "--nfs", os_release=os_release)
    assert nfs_only.returncode == 1 and "NVIDIA" not in nfs_only.stderr and "mount.nfs" in nfs_only.stderr
    assert node.commands() == []


def test_a_real_run_installs_what_is_missing_says_reboot_and_a_rerun_changes_nothing(tmp_path):
    node = Node(tmp_path)
    node.standard_fakes()
    (node.bin / "nvidia-ctk").unlink(missing_ok=True)

    first = node.run("prereqs", "--gpu", "--nfs")

    assert first.returncode == 0, first.stdout + first.stderr
    assert printed_commands(first.stdout) == debian_commands(node.root, "ubuntu2404")
    # Every command printed ran, in that order (sed is the real one: it edited the downloaded list).
    assert node.commands() == [c for c in debian_commands(node.root, "ubuntu2404") if not c.startswith("sed ")]
    assert (node.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n")
    assert "      install nvidia-open from NVIDIA's CUDA repository (ubuntu2404/" + ARCH + "), then reboot:" in first.stdout
    assert first.stdout.splitlines()[-2:] == [
        "done: 4 step(s) changed this node.",
        f"REBOOT NEEDED: the NVIDIA driver loads at boot. Reboot this node, then run {SCRIPT} prereqs --gpu --nfs again "
        "to check nvidia-smi."]

    # Before the reboot: the driver is installed but not loaded; nothing is installed again.
    before_reboot = node.run("prereqs", "--gpu", "--nfs")
    assert before_reboot.returncode == 0, before_reboot.stdout + before_reboot.stderr
    assert ("[2/5] NVIDIA driver: checked nvidia-smi -L: installed but not working (NVIDIA-SMI has failed because it "
            "couldn't communicate with the NVIDIA driver.)") in before_reboot.stdout
    assert "[3/5] NVIDIA Container Toolkit: checked nvidia-ctk --version: NVIDIA Container Toolkit CLI version 1.17.8; nothing to change" \
        in before_reboot.stdout
    assert f"[4/5] containerd nvidia runtime: checked containerd's configuration ({node.root}/etc/containerd/config.toml, " \
           f"conf.d/*.toml, k3s and RKE2's): registered in {node.root}/etc/containerd/config.toml; nothing to change" \
        in before_reboot.stdout
    assert f"[5/5] NFS client: checked mount.nfs: {node.root}/sbin/mount.nfs; nothing to change" in before_reboot.stdout
    assert before_reboot.stdout.splitlines()[-2] == "nothing to change."
    assert before_reboot.stdout.splitlines()[-1].startswith("REBOOT NEEDED")
    assert printed_commands(before_reboot.stdout) == []

    # After it: every check passes, no command runs.
    node.working_driver()
    after = node.run("prereqs", "--gpu", "--nfs")
    assert after.returncode == 0
    assert "[2/5] NVIDIA driver: checked nvidia-smi -L: 1 GPU(s) listed; nothing to change" in after.stdout
    assert after.stdout.splitlines()[-1] == "nothing to change."
    assert "REBOOT" not in after.stdout
    assert len(node.commands()) == len(debian_commands(node.root, "ubuntu2404")) - 1


def test_changing_the_node_needs_root_and_checking_it_does_not(tmp_path):
    node = Node(tmp_path, root_user=False)
    node.standard_fakes("dnf")

    run = node.run("prereqs", "--nfs", os_release="rocky-9")
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1] == f"      FAILED: changing the node needs root: sudo {SCRIPT} prereqs --nfs"
    assert node.commands() == []

    mount_nfs = node.root / "usr/sbin/mount.nfs"
    mount_nfs.parent.mkdir(parents=True)
    mount_nfs.write_text("#!/bin/sh\n")
    mount_nfs.chmod(0o755)
    run = node.run("prereqs", "--nfs", os_release="rocky-9")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"[1/1] NFS client: checked mount.nfs: {mount_nfs}; nothing to change" in run.stdout


def test_a_node_without_an_nvidia_gpu_stops_at_the_first_step(tmp_path):
    node = Node(tmp_path, gpus=0)
    node.standard_fakes()
    run = node.run("prereqs", "--gpu", "--nfs")
    assert run.returncode == 1
    assert run.stdout.splitlines()[1:] == [
        f"[1/5] NVIDIA GPUs: checked {node.root}/sys/bus/pci/devices (vendor 0x10de): none",
        "      FAILED: this node has no NVIDIA GPU: run --gpu only on GPU nodes (--nfs alone on the others)"]
    assert node.commands() == []


def test_k3s_without_a_containerd_of_its_own_is_left_to_k3s(tmp_path):
    node = Node(tmp_path)
    node.standard_fakes()
    node.working_driver()
    (node.bin / "containerd").unlink()
    (node.root / "var/lib/rancher/k3s").mkdir(parents=True)
    (node.bin / ".nvidia-ctk").rename(node.bin / "nvidia-ctk")

    run = node.run("prereqs", "--gpu")

    assert run.returncode == 1
    assert ("      by hand: k3s and RKE2 write containerd's configuration themselves and add the nvidia runtime when they "
            "start with the toolkit installed: systemctl restart k3s") in run.stdout
    assert "1 step(s) need doing by hand" in run.stderr
    assert node.commands() == []


def test_a_failing_command_stops_the_run_at_once(tmp_path):
    node = Node(tmp_path)
    node.standard_fakes()
    node.fake("apt-get", 'echo "E: Unable to locate package nfs-common" >&2; exit 100')
    run = node.run("prereqs", "--nfs")
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1] == "      FAILED: the command above exited with status 100; nothing after it ran"
    assert node.commands() == ["apt-get update"]


@pytest.mark.parametrize("args,message", [
    ([], "name a command: prereqs or storage"),
    (["upgrade"], "unknown command: upgrade"),
    (["prereqs"], "prereqs: say what to prepare: --gpu, --nfs or both"),
    (["prereqs", "--gpu", "--force"], "prereqs: unknown argument: --force"),
])
def test_usage_errors_exit_2_with_the_usage(tmp_path, args, message):
    run = Node(tmp_path).run(*args)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"cluster-bootstrap.sh: {message}\n\nusage: hack/cluster-bootstrap.sh prereqs [--gpu] [--nfs] [--dry-run]\n")


def test_it_reads_the_containerd_configuration_files_attach_checks():
    script = SCRIPT.read_text()
    for path in CONTAINERD_CONFIGS:
        assert path.replace("/*.toml", "") in script, path


def _needed(command: str) -> str:
    """The path of ``command``; hack/test-deps.sh installs it as root, so only a non-root run may lack it."""
    path = shutil.which(command)
    if path is None:
        message = f"{command} is not installed: bash hack/test-deps.sh {command} (the Debian package {command})"
        if os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_it_runs_under_busybox_sh_too(tmp_path):
    busybox = _needed("busybox")
    node = Node(tmp_path, root_user=False)
    node.standard_fakes()
    (node.bin / "nvidia-ctk").unlink(missing_ok=True)

    def run(*args: str, os_release: str) -> subprocess.CompletedProcess:
        env = {"PATH": str(node.bin), "GSHARE_BOOTSTRAP_ROOT": str(node.root),
               "GSHARE_BOOTSTRAP_OS_RELEASE": str(OS_RELEASE / os_release)}
        return subprocess.run([busybox, "sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)

    dry = run("prereqs", "--gpu", "--nfs", "--dry-run", os_release="debian-12")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert printed_commands(dry.stdout) == debian_commands(node.root, "debian12")
    unknown = run("prereqs", "--nfs", os_release="alpine")
    assert unknown.returncode == 1 and "Alpine Linux v3.23" in unknown.stderr and "mount.nfs" in unknown.stderr


def test_shellcheck_finds_nothing_in_the_hack_scripts():
    shellcheck = _needed("shellcheck")
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "hack").glob("*.sh"))
    assert "hack/cluster-bootstrap.sh" in scripts and "hack/test-deps.sh" in scripts
    run = subprocess.run([shellcheck, *scripts], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
