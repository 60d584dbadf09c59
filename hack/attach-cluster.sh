#!/usr/bin/env sh
# Attach a GPU cluster to gShare: a thin wrapper around `manage.py attach_cluster` with the same flags.
#   GSHARE_API_TOKEN=<staff API token> hack/attach-cluster.sh --kubeconfig PATH --name NAME --control-plane URL \
#     --session-domain HOST --ingress-node NODE [--routing gateway-api|ingress-nginx] [--gateway NAMESPACE/NAME] \
#     [--skip-ingress] [--storage-values PATH] [--operator-image IMAGE] [--token-file PATH] [--api-url URL]
# Run it anywhere the cluster's admin kubeconfig is (a laptop): it talks to the control plane only through its
# public API with the staff token, never opens a database, and the operator's token never passes through it.
# Relative paths in the flags are read from the directory you run it in.
set -eu
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
# The command's "then re-run:" line names this script as it was run, not manage.py.
GSHARE_ATTACH_INVOKED_AS="$0"
export GSHARE_ATTACH_INVOKED_AS
exec "$PY" "$ROOT/manage.py" attach_cluster "$@"
