#!/bin/sh
# Prepare a GPU cluster for gShare before `hack/attach-cluster.sh` (docs/attach.md, "Before attach").
#   hack/cluster-bootstrap.sh prereqs [--gpu] [--nfs] [--dry-run]    on a node, as root
#   hack/cluster-bootstrap.sh storage --values FILE [--kubeconfig PATH]    from a checkout, against the cluster
#
# `prereqs` installs what a node needs and checks before each step whether it is already there, so running it
# again changes nothing: --gpu the NVIDIA driver, the NVIDIA Container Toolkit and containerd's nvidia runtime;
# --nfs the NFS client. It reads the distribution from os-release (Debian/Ubuntu: apt-get; RHEL, Rocky,
# AlmaLinux, CentOS: dnf); on any other it stops and names what to install by hand. --dry-run prints the
# commands it would run and changes nothing (no root needed).
#
# `storage` installs the democratic-csi driver as Helm release gshare-storage in namespace gshare-storage with the
# embedded Helm engine (python -m attach.bootstrap_storage; no helm binary, no database).
#
# POSIX sh, not bash: `prereqs` runs on nodes as they come, some with only dash or BusyBox sh, and even there it
# must get far enough to say what to install by hand.
#
# For tests: GSHARE_BOOTSTRAP_OS_RELEASE names the os-release file (default /etc/os-release, then
# /usr/lib/os-release), GSHARE_BOOTSTRAP_ROOT is prefixed to every file checked or written (default: /), and
# commands are found on PATH. GSHARE_BOOTSTRAP_DRIVER_PACKAGE picks the driver package (default nvidia-open, the
# open kernel modules; cuda-drivers for GPUs older than Turing).
set -eu

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="${GSHARE_BOOTSTRAP_ROOT:-}"
DRIVER_PACKAGE="${GSHARE_BOOTSTRAP_DRIVER_PACKAGE:-nvidia-open}"
CUDA_REPOS="https://developer.download.nvidia.com/compute/cuda/repos"
TOOLKIT_REPO="https://nvidia.github.io/libnvidia-container"
# apt reads an ASCII-armoured key named *.asc in signed-by (apt >= 1.4), so the key needs no gpg to install.
TOOLKIT_KEY="/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"

usage() {
  cat <<'EOF'
usage: hack/cluster-bootstrap.sh prereqs [--gpu] [--nfs] [--dry-run]
       hack/cluster-bootstrap.sh storage --values FILE [--kubeconfig PATH]

prereqs   on a node (as root): --gpu installs the NVIDIA driver, the NVIDIA Container Toolkit and containerd's
          nvidia runtime; --nfs the NFS client (mount.nfs). Give one or both. Each step checks first and changes
          only what is missing; --dry-run prints the commands instead of running them.
storage   installs the democratic-csi driver with FILE's Helm values as release gshare-storage in namespace
          gshare-storage of the current cluster (KUBECONFIG or ~/.kube/config, or --kubeconfig PATH).
EOF
}

usage_error() {
  printf 'cluster-bootstrap.sh: %s\n\n' "$1" >&2
  usage >&2
  exit 2
}

# ---------------------------------------------------------------------------------------------- output helpers

STEP=0
STEPS=0
CHANGED=0
MANUAL=0
REBOOT=0
IS_ROOT=""

# shell_quote ARG...: the arguments as one command line a shell reads back as the same words.
shell_quote() {
  line=""
  for word in "$@"; do
    case $word in
      "" | *[!A-Za-z0-9_./:=@%+,-]*) word="'$(printf '%s' "$word" | sed "s/'/'\\\\''/g")'" ;;
    esac
    line="$line${line:+ }$word"
  done
  printf '%s\n' "$line"
}

step() {
  STEP=$((STEP + 1))
  printf '[%s/%s] %s: checked %s: %s\n' "$STEP" "$STEPS" "$1" "$2" "$3"
}

# change WHAT: the step found something missing; the commands that follow (run) fix it.
change() {
  CHANGED=$((CHANGED + 1))
  if [ "$DRY_RUN" -eq 1 ]; then printf '      would %s:\n' "$1"; else printf '      %s:\n' "$1"; fi
}

# by_hand TEXT: the step cannot be done here; the run ends with exit 1 after the remaining checks.
by_hand() {
  MANUAL=$((MANUAL + 1))
  printf '      by hand: %s\n' "$1"
}

fail() {
  printf '      FAILED: %s\n' "$1"
  exit 1
}

# run CMD ARG...: print the command, then run it unless --dry-run; stop the whole run when it fails.
run() {
  printf '        %s\n' "$(shell_quote "$@")"
  [ "$DRY_RUN" -eq 1 ] && return 0
  if [ -z "$IS_ROOT" ]; then
    IS_ROOT=no
    [ "$(id -u)" = 0 ] && IS_ROOT=yes
  fi
  if [ "$IS_ROOT" != yes ]; then
    printf '      FAILED: changing the node needs root: sudo %s prereqs%s\n' "$0" "$ARGS"
    exit 1
  fi
  "$@" || fail "the command above exited with status $?; nothing after it ran"
}

have() { command -v "$1" >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------- the distribution

# os_value KEY: KEY's value in the os-release file (the format is shell-like KEY=value, the value optionally in
# double or single quotes; os-release(5)). Read with sed, never sourced: the file is data.
os_value() {
  sed -n -e "/^$1=/{" -e "s/^$1=//" -e 's/^"\(.*\)"$/\1/' -e "s/^'\\(.*\\)'\$/\\1/" -e p -e q -e '}' "$OS_RELEASE"
}

detect_os() {
  OS_RELEASE="${GSHARE_BOOTSTRAP_OS_RELEASE:-}"
  if [ -z "$OS_RELEASE" ]; then
    OS_RELEASE="$ROOT/etc/os-release"
    [ -r "$OS_RELEASE" ] || OS_RELEASE="$ROOT/usr/lib/os-release"
  fi
  if [ ! -r "$OS_RELEASE" ]; then
    printf 'cluster-bootstrap.sh: cannot read %s: this node does not say which distribution it runs (os-release(5)); ' "$OS_RELEASE" >&2
    printf 'install the prerequisites by hand (docs/attach.md, "Before attach").\n' >&2
    exit 1
  fi
  OS_ID=$(os_value ID)
  OS_LIKE=$(os_value ID_LIKE)
  OS_VERSION=$(os_value VERSION_ID)
  OS_NAME=$(os_value PRETTY_NAME)
  [ -n "$OS_NAME" ] || OS_NAME="${OS_ID:-unknown} ${OS_VERSION}"
  FAMILY=unknown
  for word in $OS_ID $OS_LIKE; do
    case $word in
      debian | ubuntu) FAMILY=debian; break ;;
      rhel | centos | rocky | almalinux) FAMILY=rhel; break ;;
    esac
  done
}

unknown_family() {
  {
    printf 'cluster-bootstrap.sh: %s (ID=%s%s in %s) is neither a Debian/Ubuntu nor a RHEL-family distribution, ' \
      "$OS_NAME" "${OS_ID:-}" "${OS_LIKE:+, ID_LIKE=$OS_LIKE}" "$OS_RELEASE"
    printf 'so nothing was changed. Install by hand:\n'
    if [ "$GPU" -eq 1 ]; then
      printf '  - the NVIDIA driver, until nvidia-smi -L lists the GPUs (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/)\n'
      printf '  - the NVIDIA Container Toolkit, which provides nvidia-ctk (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html)\n'
      printf '  - containerd'"'"'s nvidia runtime: nvidia-ctk runtime configure --runtime=containerd && systemctl restart containerd\n'
    fi
    if [ "$NFS" -eq 1 ]; then
      printf '  - the NFS client, which provides mount.nfs (nfs-utils on openSUSE, Fedora and Alpine)\n'
    fi
  } >&2
  exit 1
}

# The architecture in NVIDIA's repository paths.
nvidia_arch() {
  case $(uname -m) in
    x86_64) echo x86_64 ;;
    aarch64 | arm64) echo sbsa ;;
    *) echo "" ;;
  esac
}

# The distribution in NVIDIA's CUDA repository paths (ubuntu2404, debian12, rhel9), or "" when there is none.
cuda_distro() {
  codename=$(os_value UBUNTU_CODENAME)
  [ -n "$codename" ] || codename=$(os_value VERSION_CODENAME)
  # Debian testing and unstable have no VERSION_ID, and no NVIDIA repository.
  if [ -z "$OS_VERSION" ]; then echo ""; return; fi
  case "$FAMILY:$OS_ID" in
    debian:ubuntu) echo "ubuntu$(printf '%s' "$OS_VERSION" | tr -d .)" ;;
    debian:debian) echo "debian${OS_VERSION%%.*}" ;;
    debian:*)
      # Derivatives (Linux Mint, Pop!_OS, ...) carry their own VERSION_ID; the codename names the base.
      case $codename in
        focal) echo ubuntu2004 ;; jammy) echo ubuntu2204 ;; noble) echo ubuntu2404 ;;
        bullseye) echo debian11 ;; bookworm) echo debian12 ;; trixie) echo debian13 ;;
        *) echo "" ;;
      esac ;;
    rhel:*) echo "rhel${OS_VERSION%%.*}" ;;
  esac
}

APT_STALE=1
apt_update() {
  if [ "$APT_STALE" -eq 1 ]; then
    run apt-get update
    APT_STALE=0
  fi
}

# pkg_install PACKAGE...: with the family's package manager.
pkg_install() {
  if [ "$FAMILY" = debian ]; then
    apt_update
    run apt-get install -y "$@"
  else
    run dnf install -y "$@"
  fi
}

# ---------------------------------------------------------------------------------------------- the steps

step_gpus() {
  count=0
  for device in "$ROOT"/sys/bus/pci/devices/*; do
    [ -r "$device/vendor" ] || continue
    if [ "$(cat "$device/vendor")" = 0x10de ]; then
      case $(cat "$device/class" 2>/dev/null) in 0x03*) count=$((count + 1)) ;; esac
    fi
  done
  if [ "$count" -eq 0 ]; then
    step "NVIDIA GPUs" "$ROOT/sys/bus/pci/devices (vendor 0x10de)" "none"
    fail "this node has no NVIDIA GPU: run --gpu only on GPU nodes (--nfs alone on the others)"
  fi
  step "NVIDIA GPUs" "$ROOT/sys/bus/pci/devices (vendor 0x10de)" "$count found"
}

step_driver() {
  if have nvidia-smi; then
    if output=$(nvidia-smi -L 2>&1); then
      step "NVIDIA driver" "nvidia-smi -L" "$(printf '%s\n' "$output" | grep -c '^GPU ') GPU(s) listed; nothing to change"
      return
    fi
    step "NVIDIA driver" "nvidia-smi -L" "installed but not working ($(printf '%s\n' "$output" | sed -n 1p))"
    REBOOT=2
    printf '      reboot the node if the driver was installed since it last booted; if nvidia-smi still fails after a reboot, reinstall the driver (%s)\n' "$DRIVER_PACKAGE"
    return
  fi
  distro=$(cuda_distro)
  arch=$(nvidia_arch)
  step "NVIDIA driver" "nvidia-smi -L" "nvidia-smi not found"
  if [ -z "$distro" ] || [ -z "$arch" ]; then
    by_hand "NVIDIA's repositories have no packages for $OS_NAME on $(uname -m): install the driver as https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/ says, until nvidia-smi -L lists the GPUs"
    return
  fi
  kernel=$(uname -r)
  change "install $DRIVER_PACKAGE from NVIDIA's CUDA repository ($distro/$arch), then reboot"
  if [ "$FAMILY" = debian ]; then
    keyring="$ROOT/var/cache/apt/archives/cuda-keyring_1.1-1_all.deb"
    pkg_install "linux-headers-$kernel" curl ca-certificates
    run curl -fsSL -o "$keyring" "$CUDA_REPOS/$distro/$arch/cuda-keyring_1.1-1_all.deb"
    run dpkg -i "$keyring"
    APT_STALE=1
    pkg_install "$DRIVER_PACKAGE"
  else
    major=${OS_VERSION%%.*}
    pkg_install dnf-plugins-core "kernel-devel-$kernel" kernel-headers
    # The driver's DKMS packages need dkms from EPEL, which needs CodeReady Builder (crb; powertools on 8).
    if [ "$OS_ID" = rhel ]; then
      run subscription-manager repos "--enable=codeready-builder-for-rhel-$major-$(uname -m)-rpms"
      pkg_install "https://dl.fedoraproject.org/pub/epel/epel-release-latest-$major.noarch.rpm"
    elif [ "$major" = 8 ]; then
      run dnf config-manager --set-enabled powertools
      pkg_install epel-release
    else
      run dnf config-manager --set-enabled crb
      pkg_install epel-release
    fi
    run dnf config-manager --add-repo "$CUDA_REPOS/$distro/$arch/cuda-$distro.repo"
    pkg_install "$DRIVER_PACKAGE"
  fi
  REBOOT=1
}

step_toolkit() {
  if have nvidia-ctk; then
    step "NVIDIA Container Toolkit" "nvidia-ctk --version" "$(nvidia-ctk --version 2>&1 | sed -n 1p); nothing to change"
    return
  fi
  step "NVIDIA Container Toolkit" "nvidia-ctk --version" "nvidia-ctk not found"
  change "install nvidia-container-toolkit from NVIDIA's repository ($TOOLKIT_REPO)"
  if [ "$FAMILY" = debian ]; then
    list="$ROOT/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    have curl || pkg_install curl ca-certificates
    run curl -fsSL -o "$ROOT$TOOLKIT_KEY" "$TOOLKIT_REPO/gpgkey"
    run curl -fsSL -o "$list" "$TOOLKIT_REPO/stable/deb/nvidia-container-toolkit.list"
    run sed -i "s#deb https://#deb [signed-by=$TOOLKIT_KEY] https://#" "$list"
    APT_STALE=1
    pkg_install nvidia-container-toolkit
  else
    run curl -fsSL -o "$ROOT/etc/yum.repos.d/nvidia-container-toolkit.repo" "$TOOLKIT_REPO/stable/rpm/nvidia-container-toolkit.repo"
    pkg_install nvidia-container-toolkit
  fi
  if [ "$DRY_RUN" -eq 0 ] && ! have nvidia-ctk; then
    fail "nvidia-container-toolkit is installed but nvidia-ctk is not on PATH ($PATH)"
  fi
}

# The containerd configuration file that registers the nvidia runtime, or "". The files are those attach's node
# check reads (CONTAINERD_CONFIGS in attach/checks.py): kubeadm and most distributions, the drop-ins
# `nvidia-ctk runtime configure` writes for containerd 2, k3s and RKE2.
nvidia_runtime_config() {
  for file in "$ROOT/etc/containerd/config.toml" "$ROOT"/etc/containerd/conf.d/*.toml \
    "$ROOT/var/lib/rancher/k3s/agent/etc/containerd/config.toml" "$ROOT/var/lib/rancher/rke2/agent/etc/containerd/config.toml"; do
    if [ -f "$file" ] && grep -Eq 'runtimes\.("nvidia"|nvidia)\]' "$file"; then
      printf '%s\n' "$file"
      return
    fi
  done
}

step_containerd() {
  checked="containerd's configuration ($ROOT/etc/containerd/config.toml, conf.d/*.toml, k3s and RKE2's)"
  found=$(nvidia_runtime_config)
  if [ -n "$found" ]; then
    step "containerd nvidia runtime" "$checked" "registered in $found; nothing to change"
    return
  fi
  step "containerd nvidia runtime" "$checked" "no nvidia runtime"
  if ! have containerd; then
    if [ -d "$ROOT/var/lib/rancher/k3s" ] || [ -d "$ROOT/var/lib/rancher/rke2" ]; then
      by_hand "k3s and RKE2 write containerd's configuration themselves and add the nvidia runtime when they start with the toolkit installed: systemctl restart k3s (k3s-agent, rke2-server or rke2-agent on this node)"
    else
      by_hand "containerd is not installed (not on PATH): install your Kubernetes distribution's containerd first, then run this again"
    fi
    return
  fi
  change "register the nvidia runtime with containerd and restart it"
  run nvidia-ctk runtime configure --runtime=containerd
  run systemctl restart containerd
  if [ "$DRY_RUN" -eq 0 ] && [ -z "$(nvidia_runtime_config)" ]; then
    fail "nvidia-ctk ran but no containerd configuration file names the nvidia runtime: look at its output above"
  fi
}

# The mount.nfs binary, or "".
mount_nfs() {
  if have mount.nfs; then command -v mount.nfs; return; fi
  for file in "$ROOT/sbin/mount.nfs" "$ROOT/usr/sbin/mount.nfs"; do
    if [ -x "$file" ]; then printf '%s\n' "$file"; return; fi
  done
}

step_nfs() {
  found=$(mount_nfs)
  if [ -n "$found" ]; then
    step "NFS client" "mount.nfs" "$found; nothing to change"
    return
  fi
  step "NFS client" "mount.nfs" "not found"
  if [ "$FAMILY" = debian ]; then package=nfs-common; else package=nfs-utils; fi
  change "install $package"
  pkg_install "$package"
  if [ "$DRY_RUN" -eq 0 ] && [ -z "$(mount_nfs)" ]; then
    fail "$package is installed but mount.nfs is not on PATH or in /sbin, /usr/sbin"
  fi
}

# ---------------------------------------------------------------------------------------------- prereqs

prereqs() {
  GPU=0
  NFS=0
  DRY_RUN=0
  ARGS=""
  for arg in "$@"; do
    case $arg in
      --gpu) GPU=1 ;;
      --nfs) NFS=1 ;;
      --dry-run) DRY_RUN=1 ;;
      -h | --help) usage; exit 0 ;;
      *) usage_error "prereqs: unknown argument: $arg" ;;
    esac
    [ "$arg" = --dry-run ] || ARGS="$ARGS $arg"
  done
  [ "$GPU" -eq 1 ] || [ "$NFS" -eq 1 ] || usage_error "prereqs: say what to prepare: --gpu, --nfs or both"
  detect_os
  [ "$FAMILY" != unknown ] || unknown_family
  if [ "$FAMILY" = debian ]; then manager=apt-get; else manager=dnf; fi
  if [ "$DRY_RUN" -eq 0 ] && ! have "$manager"; then
    printf 'cluster-bootstrap.sh: %s is a %s-family distribution but %s is not on PATH (%s)\n' "$OS_NAME" "$FAMILY" "$manager" "$PATH" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  [ "$GPU" -eq 0 ] || STEPS=$((STEPS + 4))
  [ "$NFS" -eq 0 ] || STEPS=$((STEPS + 1))
  mode=""
  [ "$DRY_RUN" -eq 0 ] || mode=", dry run: nothing is changed"
  printf 'gShare node prerequisites on %s (%s family, %s; from %s)%s\n' "$OS_NAME" "$FAMILY" "$manager" "$OS_RELEASE" "$mode"
  if [ "$GPU" -eq 1 ]; then
    step_gpus
    step_driver
    step_toolkit
    step_containerd
  fi
  [ "$NFS" -eq 0 ] || step_nfs

  if [ "$DRY_RUN" -eq 1 ]; then
    if [ "$CHANGED" -eq 0 ]; then echo "dry run: nothing would change."; else echo "dry run: $CHANGED step(s) would change this node; run again without --dry-run, as root, to do it."; fi
    [ "$REBOOT" -ne 1 ] || echo "a reboot would be needed afterwards: the NVIDIA driver loads at boot."
  else
    if [ "$CHANGED" -eq 0 ]; then echo "nothing to change."; else echo "done: $CHANGED step(s) changed this node."; fi
    [ "$REBOOT" -ne 1 ] || echo "REBOOT NEEDED: the NVIDIA driver loads at boot. Reboot this node, then run $0 prereqs$ARGS again to check nvidia-smi."
  fi
  [ "$REBOOT" -ne 2 ] || echo "REBOOT NEEDED: the NVIDIA driver is installed but not loaded. Reboot this node, then run $0 prereqs$ARGS again to check nvidia-smi."
  if [ "$MANUAL" -gt 0 ]; then
    echo "$MANUAL step(s) need doing by hand (the 'by hand' lines above); then run this again." >&2
    exit 1
  fi
}

# ---------------------------------------------------------------------------------------------- main

[ $# -gt 0 ] || usage_error "name a command: prereqs or storage"
command=$1
shift
case $command in
  prereqs) prereqs "$@" ;;
  storage)
    PY="${PYTHON:-$REPO/.venv/bin/python}"
    [ -x "$PY" ] || PY=python3
    # Relative --values/--kubeconfig paths are read from the caller's directory: the checkout goes on the path.
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
    exec "$PY" -m attach.bootstrap_storage "$@"
    ;;
  -h | --help) usage ;;
  *) usage_error "unknown command: $command" ;;
esac
