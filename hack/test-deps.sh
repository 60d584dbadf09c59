#!/usr/bin/env bash
# The Debian packages the test suite (and the demo: nginx) drives for real (tests/e2e/nginx.py runs nginx, tests/console/ drives
# Chromium through Playwright, tests/hack/ runs shellcheck on hack/*.sh and hack/cluster-bootstrap.sh under BusyBox
# sh, tests/metrics/ and tests/charts/test_metrics_chart.py run promtool, of Debian's prometheus package, on a
# live scrape and on the chart's alerting rules). `make test` calls this first, `make lint` with `shellcheck` only:
# as root it installs what is missing; otherwise it stops at once with the exact command to run.
#   hack/test-deps.sh [COMMAND...]    only the packages of these commands (default: all)
set -euo pipefail

# command to look for -> Debian package that provides it
declare -A needed=(
  [nginx]=nginx
  [chromium]=chromium
  [shellcheck]=shellcheck
  [busybox]=busybox
  [promtool]=prometheus
)
paths="$PATH:/usr/sbin:/sbin:/usr/local/sbin"

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${!needed[@]}")
missing=()
for cmd in "${wanted[@]}"; do
  if [ -z "${needed[$cmd]:-}" ]; then
    echo "hack/test-deps.sh: no Debian package is known for $cmd (known: ${!needed[*]})" >&2
    exit 2
  fi
  PATH="$paths" command -v "$cmd" >/dev/null 2>&1 || missing+=("${needed[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "hack/test-deps.sh: installing the Debian packages the tests need: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  exit 0
fi

echo "hack/test-deps.sh: the tests need these Debian packages, which are not installed: ${missing[*]}" >&2
echo "Install them, then run make again:" >&2
echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
exit 1
