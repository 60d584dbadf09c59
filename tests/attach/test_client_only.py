"""``GSHARE_CLIENT_ONLY`` (what manage.py sets for attach_cluster): a process that never opens a database or Redis, even
when DATABASE_URL and REDIS_URL point at servers; every path of the attach that reads the control plane's state goes
through its API. Each test runs a real process started as a user starts it, against loopback servers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.attach.test_api_client_hostile import STAFF, TOKEN, VERSION, Hostile, routes

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


class Listener:
    """A TCP port that counts the connections made to it (a database or Redis that must never be dialled)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port, self.connections, self.stopped = self.sock.getsockname()[1], 0, threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.stopped.set()
        self.sock.close()


@pytest.fixture
def laptop(tmp_path):
    """``(env, home)``: the environment of an operator's laptop: GSHARE_HOME in tmp_path, DATABASE_URL and REDIS_URL at
    listeners that count connections, no test settings, no token."""
    home = tmp_path / "home"
    database, redis = Listener(), Listener()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DJANGO_", "GSHARE_", "DATABASE_", "REDIS_", "PYTEST_"))}
    env.update({"GSHARE_HOME": str(home), "DATABASE_URL": f"postgres://gshare@127.0.0.1:{database.port}/gshare",
                "REDIS_URL": f"redis://127.0.0.1:{redis.port}/0", "GSHARE_LOOPBACK_ALLOWLIST": "127.0.0.1:1"})
    yield env, home, (database, redis)
    database.close()
    redis.close()


def _no_local_state(home: Path, listeners) -> None:
    assert [listener.connections for listener in listeners] == [0, 0]
    made = sorted(p.name for p in home.iterdir()) if home.exists() else []
    assert not {"postgres", "redis", "encryption.key"} & set(made), made
    # run/kube holds the Kubernetes client's PEM files (kube.client); nothing of PostgreSQL (its lock) is there.
    assert sorted(p.name for p in (home / "run").iterdir()) in ([], ["kube"]) if (home / "run").exists() else True


def test_anything_that_would_query_raises_and_nothing_local_starts(laptop):
    env, home, listeners = laptop
    script = textwrap.dedent("""
        import json, os
        os.environ["GSHARE_CLIENT_ONLY"] = "1"
        os.environ["DJANGO_SETTINGS_MODULE"] = "gshare.settings"
        import django
        django.setup()
        from django.db import connection
        from audit.services import Action, audit_record
        from clusters.models import Cluster
        tried = {}
        for name, attempt in [
            ("cursor", lambda: connection.cursor()),
            ("orm", lambda: Cluster.objects.count()),
            ("audit", lambda: audit_record(action=Action.OPERATOR_TOKEN_ROTATE, object_type="operator_token", object_id="x")),
        ]:
            try:
                attempt()
                tried[name] = "ran"
            except Exception as exc:
                tried[name] = type(exc).__name__
        print(json.dumps(tried))
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    tried = json.loads(run.stdout.strip().splitlines()[-1])
    assert tried == {"cursor": "ImproperlyConfigured", "orm": "ImproperlyConfigured", "audit": "ImproperlyConfigured"}, tried
    _no_local_state(home, listeners)


def test_a_registration_refusal_is_explained_through_the_api_only(laptop):
    """Step 6's fix names the other registration: read with GET /api/v1/clusters/{id} (registration_fix's lookup)."""
    env, home, listeners = laptop
    other = {"id": "clu_other", "name": "lab-old", "status": "connected"}
    server = Hostile(routes({"GET clusters/clu_other": other, "GET clusters": {"count": 0, "results": []},
                             "POST clusters": (409, {"code": "cluster_already_registered", "detail": "this cluster is registered",
                                                     "cluster": "clu_other"})}))
    script = textwrap.dedent(f"""
        import os, sys
        sys.argv = ["manage.py", "attach_cluster"]
        os.environ["GSHARE_CLIENT_ONLY"] = "1"
        os.environ["DJANGO_SETTINGS_MODULE"] = "gshare.settings"
        import django
        django.setup()
        from attach.run import Attach, AttachOptions, AttachStopped
        from attach.steps import register
        attach = Attach(AttachOptions(kubeconfig_path="-", name="lab-c1", control_plane_url={server.url!r}, session_domain="a.example.org",
                                      ingress_node="n1", api_token={TOKEN!r}, argv=("hack/attach-cluster.sh", "--name", "lab-c1")),
                        echo=print)
        attach.state.server, attach.state.kubeconfig = "https://k", "apiVersion: v1"
        try:
            attach.guarded(register.run)
        except AttachStopped as stop:
            print("PROBLEM", stop.problem)
            print("FIX", stop.fix)
    """)
    try:
        run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.close()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "already registered as lab-old (clu_other)" in run.stdout and "--name lab-old" in run.stdout, run.stdout
    assert [(method, path.split("?")[0]) for method, path, _ in server.seen] == [
        ("GET", "/api/v1/clusters"), ("POST", "/api/v1/clusters"), ("GET", "/api/v1/clusters/clu_other")]
    assert TOKEN not in run.stdout + run.stderr
    _no_local_state(home, listeners)


@pytest.mark.parametrize("via", ["manage.py", "hack/attach-cluster.sh"])
def test_the_command_never_dials_the_database_or_redis_of_its_environment(laptop, tmp_path, via):
    env, home, listeners = laptop
    server = Hostile(routes({"version": VERSION, "me": STAFF}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "kube-token"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    flags = ["--kubeconfig", str(kubeconfig), "--name", "lab-c1", "--control-plane", server.url, "--session-domain", "lab-c1.example.org",
             "--ingress-node", "n1", "--token-file", str(token_file)]
    argv = [sys.executable, str(ROOT / "manage.py"), "attach_cluster", *flags] if via == "manage.py" else [str(ROOT / "hack" / "attach-cluster.sh"), *flags]
    try:
        run = subprocess.run(argv, cwd=tmp_path, env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=90, check=False)
    finally:
        server.close()
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"gShare 0.2.0 at {server.url} as admin" not in run.stdout  # step 1 stops at the apiserver, after the checks
    assert "did not answer" in run.stdout and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert [path for _, path, _ in server.seen] == ["/api/v1/version", "/api/v1/me"]
    assert TOKEN not in run.stdout + run.stderr
    _no_local_state(home, listeners)
