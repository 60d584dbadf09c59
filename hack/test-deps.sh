#!/usr/bin/env bash
# The Debian packages the test suite drives for real (tests/e2e/nginx.py runs nginx, tests/console/ drives
# Chromium through Playwright). `make test` calls this first: as root it installs what is missing; otherwise it
# stops at once with the exact command to run.
set -euo pipefail

# command to look for -> Debian package that provides it
declare -A needed=(
  [nginx]=nginx
  [chromium]=chromium
)
paths="$PATH:/usr/sbin:/sbin:/usr/local/sbin"

missing=()
for cmd in "${!needed[@]}"; do
  PATH="$paths" command -v "$cmd" >/dev/null 2>&1 || missing+=("${needed[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing the Debian packages the tests need: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  exit 0
fi

echo "make test: the tests need these Debian packages, which are not installed: ${missing[*]}" >&2
echo "Install them, then run make test again:" >&2
echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
exit 1
