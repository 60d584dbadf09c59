"""``manage.py demo``: the whole system on embedded defaults, with two emulated GPU clusters.

Steps: a fresh ``gshare_demo`` database on the configured PostgreSQL server (embedded by default),
migrations, a staff user and an API token, two Kubernetes API emulators (``demo.emulator``) seeded
with the demo fleet (``demo.fleet``, real HAMi and nvidia-smi data), registration of each through
``cluster_register`` (the same service as ``POST /api/v1/clusters``, probe included) with the control plane's
least-privilege ServiceAccount token (``attach.least_privilege``, made with the emulator's admin token), the web
server (gunicorn behind nginx, ``gshare.front_proxy``), a Celery worker and beat, one real operator process per cluster with a
token minted for it, and the clusters' ingress (``demo.ingress_nginx``: what ingress-nginx does for the
session Ingresses, and Envoy Gateway for the session HTTPRoutes of the cluster in ``gateway-api`` routing mode,
``--gateway-cluster``, lab-c2 by default; on ``http://<cluster>.gshare.localhost:<ingress port>``, in front of a
stand-in page for each session pod). It then waits until every cluster's inventory has arrived through its
operator and writes the state file. Besides the staff user ``admin`` it creates a researcher
``alice`` (not staff) with credits, for the console's researcher side.

Every run starts clean: what a previous run left under ``.gshare/demo/`` (each cluster's folder with
its operator's usage queue, the logs, beat's schedule) is removed first. The web server is one, but
seen under two names: ``http://localhost:<port>`` is the public side (console, API), where the
internal plane answers 404, and ``http://127.0.0.1:<port>`` is the internal host
(``GSHARE_INTERNAL_HOSTS``) the operators and the session Ingresses' connect verify use. A child that
exits is started again with backoff (``demo.processes``) instead of stopping the demo.

With ``--bare-cluster NAME`` (repeatable) it also starts a cluster with nothing installed and the chart repository
attach installs from (``demo.bare_demo``, ``demo.bare_cluster``), and prints the attach command for it.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import shlex
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

import psycopg
import requests
import yaml
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from attach.least_privilege import least_privilege_kubeconfig
from billing.services import credit_grant, policy_set, price_set
from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from contract import ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX
from core.home import gshare_home
from demo import fleet
from demo.bare_cluster import UNPREPARED_NODE
from demo.bare_demo import STATE_EVAL, BareClusters
from demo.gpu_activity import GpuActivityError, idle_smoke
from demo.processes import ChildFailed, ProcessGroup, python_argv
from demo.queue_scene import QueueSceneError, queue_scene
from gshare.embedded import embedded_release
from gshare.front_proxy import ProxySettings, render_nginx_conf
from identity.tokens import api_token_create
from kube.kubeconfig import validate_kubeconfig
from storage.models import StorageCapacityReading
from storage.services import pool_create, pools_refresh_capacity

DEMO_DATABASE = "gshare_demo"
#: The demo's researcher (not staff) and the credits granted to them.
RESEARCHER = "alice"
RESEARCHER_CREDITS = 200
#: The cluster whose H20s the queue scene fills (``demo.queue_scene``).
QUEUE_CLUSTER = "lab-c2"
READY_TIMEOUT = 90.0
#: The demo's billing period and settle time (seconds) unless the environment sets them: short, so period charges show.
DEMO_BILLING_PERIOD_SECONDS = 300
DEMO_BILLING_SETTLE_SECONDS = 30


class DemoError(RuntimeError):
    """The demo could not start; the message says which step failed and why."""


@dataclass
class DemoOptions:
    """Options of ``manage.py demo``.

    Attributes:
        port: web server port on 127.0.0.1 (0 picks a free one); public as ``localhost``, internal as ``127.0.0.1``.
            The clusters' ingress listens on the next port (``port + 1``), or on a free one with ``port`` 0 or when
            that one is taken.
        state_file: where the JSON state is written.
        smoke: wait for the inventories, print the state, stop everything, exit.
        inventory_interval: operators' inventory interval, seconds.
        bare_clusters: names of bare clusters to start for trying attach (``demo.bare_demo``).
        idle_timeout: seconds without a GPU kernel before the default policy stops a session (a policy
            minute lasts a second, so the warning is a quarter of it); None keeps the production default (60 minutes).
        gateway_cluster: the fleet cluster in ``gateway-api`` routing mode (seeded with Envoy Gateway and the session
            Gateway, registered with ``routing=gateway-api``); the others use ingress-nginx; None: every cluster does.
    """

    port: int
    state_file: Path
    smoke: bool
    inventory_interval: int = 10
    bare_clusters: tuple[str, ...] = ()
    idle_timeout: int | None = None
    gateway_cluster: str | None = fleet.GATEWAY_CLUSTER_DEFAULT

    def routing(self, name: str) -> str:
        """The routing mode of fleet cluster ``name`` in this run."""
        return ROUTING_GATEWAY_API if name == self.gateway_cluster else ROUTING_INGRESS_NGINX


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _front_proxy_argv(prefix: Path, *, listen: str, upstream: str) -> list[str]:
    """nginx's command line in front of the demo's gunicorn, its configuration written to ``prefix``.

    Raises:
        DemoError: nginx is not installed (the Debian package ``nginx`` provides it).
    """
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if binary is None:
        raise DemoError("nginx is not installed: the demo serves the web server behind nginx as the chart does "
                        "(docs/performance.md, \"Slow clients\"); install it (`sudo apt-get install -y nginx`)")
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    user = None
    if os.geteuid() == 0:  # as root nginx would run its workers as nobody, who cannot write to prefix
        user = f"{pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name}"
    conf = prefix / "nginx.conf"
    conf.write_text(render_nginx_conf(ProxySettings(listen=listen, upstream=upstream, prefix=str(prefix), user=user)))
    return [binary, "-e", "stderr", "-p", f"{prefix}/", "-c", str(conf)]


def _ingress_port(web_port: int) -> int:
    """The demo ingress's port: ``web_port + 1`` when free, else (or with ``web_port`` 0) any free port."""
    if web_port and web_port < 65535:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", web_port + 1))
                return web_port + 1
            except OSError:
                pass
    return _free_port()


def _database_url_with_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _fresh_database() -> str:
    """Drop and re-create the demo database; point this process at it; return its URL."""
    base_url = os.environ["DATABASE_URL"]
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [DEMO_DATABASE],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{DEMO_DATABASE}"')
        conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}"')
    connections.close_all()
    for alias in ("default",):
        connections[alias].settings_dict["NAME"] = DEMO_DATABASE
        settings.DATABASES[alias]["NAME"] = DEMO_DATABASE
    return _database_url_with_name(base_url, DEMO_DATABASE)


def _wait_for_file(path: Path, what: str, group: ProcessGroup, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        _check_children(group)
        time.sleep(0.1)
    raise DemoError(f"{what} did not become ready within {timeout:g} s")


def _check_children(group: ProcessGroup) -> None:
    """Start again the children that exited (with backoff, announced); DemoError when one keeps failing."""
    try:
        group.supervise()
    except ChildFailed as exc:
        raise DemoError(str(exc)) from None


def _wipe_previous_run(workdir: Path) -> None:
    """Remove what an earlier run left in ``workdir``: each cluster's folder (kubeconfig, tokens, and the operator's
    usage queue, which belongs to that run's cluster id), the logs and beat's schedule."""
    for spec in fleet.FLEET:
        shutil.rmtree(workdir / spec.name, ignore_errors=True)
    shutil.rmtree(workdir / "logs", ignore_errors=True)
    for path in workdir.glob("celerybeat-schedule*"):
        path.unlink(missing_ok=True)


def _check_internal_plane(url: str, internal_url: str) -> None:
    """The JWKS answers 404 on the public name and 200 on the internal one, or DemoError."""
    path = "/.well-known/gshare-internal-jwks.json"
    public, internal = requests.get(url + path, timeout=10), requests.get(internal_url + path, timeout=10)
    if public.status_code != 404 or internal.status_code != 200:
        raise DemoError(f"the internal plane is not closed on the public host: {url}{path} answered {public.status_code} (expected 404), "
                        f"{internal_url}{path} answered {internal.status_code} (expected 200)")


def _wait_for_http(url: str, group: ProcessGroup, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        _check_children(group)
        time.sleep(0.2)
    raise DemoError(f"the web server did not answer {url} within {timeout:g} s")


def run_demo(options: DemoOptions) -> dict:
    """Start the demo; return the state dict once every inventory has arrived.

    With ``options.smoke`` everything is stopped before returning; otherwise this blocks until
    Ctrl-C (or SIGTERM) and then stops everything.

    Returns:
        ``{"url", "internal_url", "admin_user", "admin_password", "api_token", "researcher_user", "researcher_password",
        "ingress": {"url", "port"}, "clusters": [{"id", "name", "session_domain", "routing", "session_host" (domain:port),
        "ingress_url", "kubeconfig_path", "nodes", "gpus"}], "bare_clusters": [{"name", "admin_kubeconfig",
        "attach_command", ...}] (``BareClusters.state``; empty without ``options.bare_clusters``)}``.

    Raises:
        DemoError: a step failed; every process started so far has been stopped.
    """
    workdir = gshare_home() / "demo"
    options.state_file.unlink(missing_ok=True)  # never leave a previous run's URL and credentials around
    _wipe_previous_run(workdir)
    BareClusters.wipe(workdir, list(options.bare_clusters))
    group = ProcessGroup(log_dir=workdir / "logs", say=_say)
    bare = BareClusters()
    try:
        _say("creating a fresh database and applying migrations")
        database_url = _fresh_database()
        call_command("migrate", interactive=False, verbosity=0)

        from django.contrib.auth import get_user_model

        password = secrets.token_urlsafe(12)
        get_user_model().objects.create_superuser("admin", "admin@gshare.localhost", password)
        _, api_token = api_token_create(username="admin", name="demo")
        credit_grant(user=get_user_model().objects.get(username="admin"), amount=Decimal(1000), reason="demo credits",
                     idempotency_key="demo-initial-grant", created_by="command:demo")
        researcher_password = secrets.token_urlsafe(12)
        researcher = get_user_model().objects.create_user(RESEARCHER, f"{RESEARCHER}@gshare.localhost", researcher_password)
        credit_grant(user=researcher, amount=Decimal(RESEARCHER_CREDITS), reason="demo credits",
                     idempotency_key="demo-researcher-grant", created_by="command:demo")
        _, researcher_token = api_token_create(username=RESEARCHER, name="demo")
        if options.idle_timeout is not None:
            # A policy minute lasts a second here (GSHARE_IDLE_POLICY_MINUTE_SECONDS, also in the children's environment).
            settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS = 1
            policy_set(user=None, idle_timeout_minutes=options.idle_timeout, idle_warning_minutes=max(1, options.idle_timeout // 4),
                       min_balance_hours=Decimal(str(settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS)),
                       grace_seconds=settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS)

        demo_prices = {"H100": "4.0", "H20": "3.0", "V100": "1.5", "T4": "0.5"}  # credits per GPU-hour, illustrative
        for model in sorted({m for spec in fleet.FLEET for m in fleet.expected_inventory(spec.name)["models"]}):
            price = next((p for key, p in demo_prices.items() if key in model), None)
            if price is not None:
                price_set(gpu_model=model, credits_per_gpu_hour=Decimal(price))

        _say("starting the emulated clusters")
        emulators = {}
        for spec in fleet.FLEET:
            folder = workdir / spec.name
            folder.mkdir(parents=True, exist_ok=True)
            seed, ready = folder / "seed.json", folder / "emulator-ready.json"
            ready.unlink(missing_ok=True)
            fleet.write_seed(spec.name, seed, routing=options.routing(spec.name))
            emulator_token = secrets.token_urlsafe(24)
            token_file = folder / "emulator-token"
            token_file.write_text(emulator_token)
            token_file.chmod(0o600)
            def emulator_argv(port: int, seed=seed, ready=ready, token_file=token_file) -> list[str]:
                return python_argv("-m", "demo.emulator", "--seed", str(seed), "--port", str(port), "--ready-file", str(ready),
                                   "--token-file", str(token_file))

            child = group.start(f"emulator-{spec.name}", emulator_argv(0), env=dict(os.environ), cwd=settings.BASE_DIR)
            emulators[spec.name] = (folder, ready, emulator_token, child, emulator_argv)
        allowlist = list(settings.GSHARE_LOOPBACK_ALLOWLIST)
        urls = {}
        for name, (_folder, ready, _, child, emulator_argv) in emulators.items():
            urls[name] = _wait_for_file(ready, f"the emulator of {name}", group)["url"]
            allowlist.append(urls[name].split("://", 1)[1])
            child.argv = emulator_argv(urlsplit(urls[name]).port)  # a restart comes back where the kubeconfig points
        if options.bare_clusters:
            _say(f"starting the bare cluster(s) {', '.join(options.bare_clusters)} and the chart repository attach installs from")
            try:
                bare.start(list(options.bare_clusters), workdir, group, cwd=settings.BASE_DIR, env=dict(os.environ),
                           inventory_interval=options.inventory_interval, wait_for_file=_wait_for_file)
            except ValueError as exc:
                raise DemoError(str(exc)) from None
            allowlist += bare.allowlist()
        settings.GSHARE_LOOPBACK_ALLOWLIST = allowlist

        _say("registering the clusters with least-privilege ServiceAccount tokens (probe included)")
        clusters = []
        for spec in fleet.FLEET:
            folder, _, emulator_token, _, _ = emulators[spec.name]
            kubeconfig = _kubeconfig(spec.name, urls[spec.name], emulator_token)
            kubeconfig_path = folder / "kubeconfig.yaml"
            kubeconfig_path.write_text(kubeconfig)
            kubeconfig_path.chmod(0o600)
            # Registered with the control plane's least-privilege ServiceAccount, made through the admin kubeconfig as
            # attach_cluster makes it; the operator and the ingress keep the admin one.
            admin = validate_kubeconfig(kubeconfig, loopback_allowlist=allowlist)
            cluster = cluster_services.cluster_register(
                name=spec.name,
                kubeconfig=least_privilege_kubeconfig(admin.config, server=admin.server, timeout=settings.GSHARE_PROBE_TIMEOUT),
                session_domain=fleet.session_domain(spec.name),
                ingress_node=spec.ingress_node,
                volume_storage_class="gshare-nfs",
                routing=options.routing(spec.name),
            )
            token_path = folder / "internal-jwt"
            token_path.write_text(operator_token_mint(cluster_id=cluster.public_id))
            token_path.chmod(0o600)
            clusters.append((spec, cluster, kubeconfig_path, token_path))

        _say(f"registering the shared NFS pool (StorageClass {fleet.STORAGE_CLASS} on every cluster)")
        pool = pool_create(name="lab-nfs", cluster=clusters[0][1], storage_class=fleet.STORAGE_CLASS,
                           sharing="all", manual_capacity_gb=1024)

        port = options.port or _free_port()
        url = f"http://localhost:{port}"  # the public side: console and API
        internal_url = f"http://127.0.0.1:{port}"  # the internal host: operators, connect verify, JWKS

        ingress_port = _ingress_port(options.port)
        _say(f"starting the clusters' ingress on 127.0.0.1:{ingress_port} "
             f"({', '.join(f'http://{name}.gshare.localhost:{ingress_port}' for name in [spec.name for spec, *_ in clusters] + list(options.bare_clusters))})")
        ingress_config, ingress_ready = workdir / "ingress.json", workdir / "ingress-ready.json"
        ingress_ready.unlink(missing_ok=True)
        ingress_config.write_text(json.dumps({"clusters": [
            {"name": spec.name, "session_domain": cluster.session_domain, "kubeconfig": str(kubeconfig_path)}
            for spec, cluster, kubeconfig_path, _ in clusters
        ] + bare.ingress_entries()}, indent=2))
        group.start("ingress", python_argv("-m", "demo.ingress_nginx", "--config", str(ingress_config), "--port", str(ingress_port),
                                           "--ready-file", str(ingress_ready)),
                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=settings.BASE_DIR)
        ingress_url = _wait_for_file(ingress_ready, "the clusters' ingress", group)["url"]
        # Session URLs and connect links: http, on the demo ingress's port (GSHARE_SESSION_PORT).
        settings.GSHARE_SESSION_SCHEME, settings.GSHARE_SESSION_PORT = "http", ingress_port
        child_env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": settings.REDIS_URL,
            "GSHARE_LOOPBACK_ALLOWLIST": ",".join(allowlist),
            "DJANGO_SETTINGS_MODULE": "gshare.settings",
            "GSHARE_CONTROL_PLANE_URL": internal_url,
            "GSHARE_INTERNAL_HOSTS": "127.0.0.1",
            "GSHARE_SESSION_SCHEME": "http",
            "GSHARE_SESSION_PORT": str(ingress_port),
            "GSHARE_IDLE_POLICY_MINUTE_SECONDS": str(settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS),
            # Five-minute billing periods (an hour by default), so a demo's ledger shows period charges within minutes.
            "GSHARE_BILLING_PERIOD_SECONDS": os.environ.get("GSHARE_BILLING_PERIOD_SECONDS", str(DEMO_BILLING_PERIOD_SECONDS)),
            "GSHARE_BILLING_SETTLE_SECONDS": os.environ.get("GSHARE_BILLING_SETTLE_SECONDS", str(DEMO_BILLING_SETTLE_SECONDS)),
            "PYTHONUNBUFFERED": "1",
        }
        _say(f"starting the web server on 127.0.0.1:{port} ({url} public, {internal_url} internal), a Celery worker and beat")
        # gunicorn's sync workers behind nginx, as the chart runs them: slow clients meet nginx's timeouts, never a
        # worker (gshare/front_proxy.py); gunicorn's config redacts credentials from its log (gshare/access_log.py).
        web_port = _free_port()
        group.start(
            "web",
            python_argv("-m", "gunicorn", "gshare.wsgi", "--bind", f"127.0.0.1:{web_port}", "--workers", "2",
                        "--timeout", "60", "--access-logfile", "-", "--config", "python:gshare.gunicorn_hooks"),
            env=child_env, cwd=settings.BASE_DIR,
        )
        group.start("front-proxy", _front_proxy_argv(workdir / "front-proxy", listen=f"127.0.0.1:{port}",
                                                     upstream=f"127.0.0.1:{web_port}"),
                    env=dict(os.environ), cwd=settings.BASE_DIR)
        group.start("worker", python_argv("-m", "celery", "-A", "gshare", "worker", "--loglevel", "INFO", "--concurrency", "2"),
                    env=child_env, cwd=settings.BASE_DIR)
        group.start("beat", python_argv("-m", "celery", "-A", "gshare", "beat", "--loglevel", "INFO",
                                        "--schedule", str(workdir / "celerybeat-schedule")),
                    env=child_env, cwd=settings.BASE_DIR)
        _wait_for_http(f"{url}/healthz", group)
        _check_internal_plane(url, internal_url)

        _say("starting one operator per cluster")
        for spec, cluster, kubeconfig_path, token_path in clusters:
            operator_env = {
                key: value for key, value in os.environ.items()
                if not key.startswith(("DATABASE_", "REDIS_", "DJANGO_", "GSHARE_"))
            }
            operator_env.update({
                "GSHARE_CLUSTER_ID": cluster.public_id,
                "GSHARE_CONTROL_PLANE_URL": internal_url,
                "GSHARE_TOKEN_FILE": str(token_path),
                "GSHARE_INVENTORY_INTERVAL": str(options.inventory_interval),
                "GSHARE_VOLUME_STORAGE_CLASS": fleet.STORAGE_CLASS,
                "GSHARE_VOLUME_SYNC_INTERVAL": str(options.inventory_interval),
                "GSHARE_USAGE_INTERVAL": str(options.inventory_interval),
                # HAMi's vGPU monitor read this often: the idle policy's clock (a second per minute with --idle-timeout).
                "GSHARE_ACTIVITY_INTERVAL": "2" if options.idle_timeout is not None else str(min(options.inventory_interval, 10)),
                "GSHARE_USAGE_QUEUE_PATH": str(kubeconfig_path.parent / "usage-queue.sqlite3"),
                # One operator per cluster on one machine: their /metrics would clash on one port (and listen off loopback).
                "GSHARE_METRICS_PORT": "0",
                "KUBECONFIG": str(kubeconfig_path),
                "PYTHONUNBUFFERED": "1",
            })
            group.start(f"operator-{spec.name}", python_argv("-m", "operator_agent"), env=operator_env, cwd=settings.BASE_DIR)

        _say("waiting for every cluster's inventory to arrive through its operator")
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            connections.close_all()
            rows = {c.public_id: c for c in Cluster.objects.all()}
            counts = {
                cluster.public_id: (rows[cluster.public_id].nodes.count(), rows[cluster.public_id].devices.count())
                for _, cluster, _, _ in clusters
            }
            reported = set(StorageCapacityReading.objects.filter(storage_class=fleet.STORAGE_CLASS, capacity_bytes__isnull=False)
                           .values_list("cluster__public_id", flat=True))
            waiting = [
                spec.name for spec, cluster, _, _ in clusters
                if rows[cluster.public_id].last_heartbeat_at is None
                or counts[cluster.public_id] != _expected(spec.name)
                or cluster.public_id not in reported
            ]
            if not waiting:
                break
            _check_children(group)
            if time.monotonic() > deadline:
                raise DemoError(f"no complete inventory from {', '.join(waiting)} within {READY_TIMEOUT:g} s; see the operator logs in {group.log_dir}")
            time.sleep(0.5)

        pools_refresh_capacity()
        pool.refresh_from_db()
        state = {
            "url": url,
            "internal_url": internal_url,
            "storage_pool": {"id": pool.public_id, "name": pool.name, "storage_class": pool.storage_class,
                             "capacity_bytes": pool.capacity_bytes, "source": pool.capacity_source},
            "admin_user": "admin",
            "admin_password": password,
            "api_token": api_token,
            "researcher_user": RESEARCHER,
            "researcher_password": researcher_password,
            "researcher_api_token": researcher_token,
            "ingress": {"url": ingress_url, "port": ingress_port},
            "clusters": [
                {
                    "id": cluster.public_id,
                    "name": spec.name,
                    "session_domain": cluster.session_domain,
                    "routing": cluster.routing,
                    "session_host": f"{cluster.session_domain}:{ingress_port}",
                    "ingress_url": f"http://{cluster.session_domain}:{ingress_port}",
                    "kubeconfig_path": str(kubeconfig_path),
                    # The emulator's control API (demo.gpu_activity marks a session's GPUs busy or idle through it).
                    "emulator_url": urls[spec.name],
                    "emulator_token_file": str(kubeconfig_path.parent / "emulator-token"),
                    "nodes": counts[cluster.public_id][0],
                    "gpus": counts[cluster.public_id][1],
                }
                for spec, cluster, kubeconfig_path, _ in clusters
            ],
            "bare_clusters": bare.state(api_token=api_token, control_plane=internal_url, checkout=settings.BASE_DIR),
        }
        if options.smoke:
            _say("smoke: starting a session on each cluster and waiting until both are Running")
            state["sessions"] = _smoke_sessions(url, api_token, state["clusters"], group, ingress_url)
            state["metrics"] = _smoke_metrics(internal_url, state["clusters"])
            _say("smoke: GET /metrics on the internal host lists every GPU of every cluster: "
                 + ", ".join(f"{name} {n}" for name, n in state["metrics"]["gpus"].items()))
            if options.idle_timeout is not None:
                _say(f"smoke: one session busy, one left idle: the idle one must be warned and stopped within {options.idle_timeout} s")
                try:
                    state["idle_policy"] = idle_smoke(state, idle_timeout=options.idle_timeout, check_children=lambda: _check_children(group))
                except GpuActivityError as exc:
                    raise DemoError(f"idle policy: {exc}") from None
                idle = state["idle_policy"]["idle"]
                _say(f"smoke: {idle['id']} warned (stops at {idle['stops_at']}), then stopped by the idle policy; its end entry: "
                     f"{idle['idle_credits']} credits burned while idle; {state['idle_policy']['busy']['id']} (busy) kept running")
        lab_c2 = next(c for c in state["clusters"] if c["name"] == QUEUE_CLUSTER)
        try:
            scene = queue_scene(url=url, admin_token=api_token, researcher_token=researcher_token, cluster_id=lab_c2["id"],
                                release=options.smoke)
        except QueueSceneError as exc:
            raise DemoError(f"queue: {exc}") from None
        state["queue"] = {"filler": scene["filler"]["id"], "queued": scene["queued"]["id"],
                          "estimated_start": scene["queued"]["estimated_start"], "admitted": "admitted" in scene}
        if options.smoke:
            _say(f"smoke: {scene['queued']['id']} (2 x H20) queued behind {scene['filler']['id']} with an estimate of "
                 f"{scene['queued']['estimated_start']}; started by the queue once {scene['filler']['id']} stopped")
        options.state_file.parent.mkdir(parents=True, exist_ok=True)
        options.state_file.write_text(json.dumps(state, indent=2) + "\n")
        options.state_file.chmod(0o600)
        summary = ", ".join(f"{c['name']}: {c['nodes']} nodes, {c['gpus']} GPUs" for c in state["clusters"])
        _say(f"ready: {summary}")
        _say(f"storage: pool {pool.name} ({fleet.STORAGE_CLASS}, shared by every cluster): "
             f"{(pool.capacity_bytes or 0) / 2**40:.2f} TiB from {pool.capacity_source}")
        _say(f"console: {url}/  (user admin, password {password}; researcher {RESEARCHER}, password {researcher_password})")
        _say("sessions: " + ", ".join(f"{c['ingress_url']}/s/<session id>/" for c in state["clusters"])
             + f"  (each cluster's ingress, on 127.0.0.1:{ingress_port}; Open in the console gives the link)")
        _say(f"API:     curl -H 'Authorization: Bearer {api_token}' {url}/api/v1/clusters")
        idle_text = (f"{options.idle_timeout} s without a GPU kernel" if options.idle_timeout is not None
                     else "60 min without a GPU kernel (--idle-timeout SECONDS shortens it)")
        _say(f"idle policy: sessions stop after {idle_text}; new sessions' GPUs are idle: mark one busy with "
             f".venv/bin/python -m demo.gpu_activity <session id> busy")
        _say(f"internal plane (the operators' control-plane URL): {internal_url}/internal/ and /.well-known/, 404 on {url}:")
        _say(f"         curl {url}/.well-known/gshare-internal-jwks.json  -> 404;  curl {internal_url}/.well-known/gshare-internal-jwks.json  -> the JWKS")
        for entry in [] if options.smoke else state["bare_clusters"]:
            _say(f"bare cluster {entry['name']} (nothing installed yet; admin kubeconfig {entry['admin_kubeconfig']}): attach it "
                 f"from another shell in this checkout with\n\n    {entry['attach_command']}\n\n"
                 f"         or, from the state file: STATE={shlex.quote(str(options.state_file))} {STATE_EVAL}\n"
                 f"         its node {UNPREPARED_NODE} has no nvidia runtime in containerd yet; prepare it with: "
                 f"{entry['fix_command']}")
        if not options.smoke:
            _say(f"queue:   {QUEUE_CLUSTER}'s 8 H20s are held by {state['queue']['filler']} (8 h); {RESEARCHER}'s "
                 f"{state['queue']['queued']} (2 x H20) waits in the queue, expected to start at {state['queue']['estimated_start']}: "
                 "log in as the researcher to see its place, estimate and alternatives")
        _say(f"state:   {options.state_file}; logs: {group.log_dir}")
        if options.smoke:
            return state
        _say("press Ctrl-C to stop everything")
        while True:
            _check_children(group)
            time.sleep(1)
    finally:
        _say("stopping every process the demo started")
        group.stop()
        bare.stop()
        connections.close_all()
        if not options.smoke:
            options.state_file.unlink(missing_ok=True)
        # The embedded PostgreSQL and Redis this run started stop with it (unless another process, such as a test
        # suite in the same checkout, still uses them): a next run must not find a stale server.
        embedded_release()


def _through_ingress(ingress_url: str, link: str, cookie: str = "") -> requests.Response:
    """GET ``link`` (``http://<session host>/s/...``) through the demo ingress, as a browser resolving ``*.localhost``
    to loopback sends it (``requests`` resolves no ``*.localhost`` name, and keeps a Secure cookie off plain http)."""
    parts = urlsplit(link)
    headers = {"Host": parts.netloc, **({"Cookie": cookie} if cookie else {})}
    target = ingress_url + parts.path + (f"?{parts.query}" if parts.query else "")
    return requests.get(target, headers=headers, timeout=30, allow_redirects=False)


def _smoke_open(url: str, headers: dict, ingress_url: str, session: dict, group: ProcessGroup, *,
                routing: str = ROUTING_INGRESS_NGINX) -> dict:
    """Open ``session``'s connect link through the demo ingress: its stand-in page and the connect cookie, then the
    cookie alone.

    ingress-nginx (``routing``): the link answers the page with the cookie (``auth-always-set-cookie``). gateway-api:
    Envoy passes the ext_authz check's ``307`` to the browser (the cookie, the link without its token), and the
    browser follows it with the cookie; both answers must come from the Envoy stand-in (``Server: envoy``), i.e. from
    the session's HTTPRoute, not from an Ingress.

    Returns:
        ``{"link", "status", "cookie_status", "page_has_volume", "routing", "served_by"}`` (the link keeps its token:
        the caller checks the link is refused once the session has stopped).

    Raises:
        DemoError: the link or the cookie did not reach the session's page (the way its routing mode does it).
    """
    response = requests.post(f"{url}/api/v1/sessions/{session['id']}/connect", headers=headers, timeout=30)
    if response.status_code != 200:
        raise DemoError(f"a connect link for {session['id']} answered {response.status_code}: {response.text[:300]}")
    link = response.json()["url"]
    deadline = time.monotonic() + 30
    while True:  # the ingress lists the cluster's Ingresses and HTTPRoutes every second
        page = _through_ingress(ingress_url, link)
        if page.status_code != 404 or time.monotonic() > deadline:
            break
        _check_children(group)
        time.sleep(0.5)
    cookie = page.headers.get("Set-Cookie", "").split(";", 1)[0]
    first_status = page.status_code
    if routing == ROUTING_GATEWAY_API:
        served_by = page.headers.get("Server", "")
        if page.status_code != 307 or served_by != "envoy" or not cookie.startswith("gshare_connect="):
            raise DemoError(f"opening {session['id']} through Envoy Gateway ({urlsplit(link).netloc}) answered "
                            f"{page.status_code} from {served_by or 'an unknown server'} "
                            f"{'with' if cookie else 'without'} the connect cookie, not ext_authz's 307 with it "
                            f"(an HTTPRoute and SecurityPolicy for the session, the control plane's ext-authz): "
                            f"{page.text[:300]}")
        page = _through_ingress(ingress_url, urljoin(link, page.headers.get("Location", "")), cookie=cookie)
    if page.status_code != 200 or session["id"] not in page.text or not cookie.startswith("gshare_connect="):
        raise DemoError(f"opening {session['id']} through the ingress ({urlsplit(link).netloc}) answered {page.status_code} "
                        f"{'with' if cookie else 'without'} the connect cookie: {page.text[:300]}")
    again = _through_ingress(ingress_url, f"{link.split('?', 1)[0]}lab", cookie=cookie)
    if again.status_code != 200 or session["id"] not in again.text:
        raise DemoError(f"the connect cookie of {session['id']} did not reach its page: {again.status_code} {again.text[:300]}")
    served_by = again.headers.get("Server", "")
    if routing == ROUTING_GATEWAY_API and served_by != "envoy":
        raise DemoError(f"the page of {session['id']} came from {served_by}, not from the session's HTTPRoute")
    return {"link": link, "status": first_status, "cookie_status": again.status_code,
            "page_has_volume": "/data/" in page.text, "routing": routing, "served_by": served_by}


def _smoke_sessions(url: str, api_token: str, clusters: list[dict], group: ProcessGroup, ingress_url: str) -> list[dict]:
    """Start one session per cluster through the API, wait until Running, check its URL's host, open the first
    through the clusters' ingress (page and cookie) and the session of every other cluster in ``gateway-api`` mode
    through Envoy Gateway (``_smoke_open``), stop them, and check those links are refused.

    Returns:
        ``[{"id", "cluster", "url", "node", "devices", "phase"}]`` with the final phase (Terminated); those opened
        also have ``"opened": {"status", "cookie_status", "page_has_volume", "routing", "served_by",
        "refused_after_stop"}``.

    Raises:
        DemoError: a session did not reach Running (or Terminated) in time, its URL is on another host, it did not
            open through the ingress, or its link still opened after it stopped.
    """
    headers = {"Authorization": f"Bearer {api_token}"}
    api = f"{url}/api/v1/sessions"
    volumes_api = f"{url}/api/v1/storage/volumes"
    response = requests.post(volumes_api, headers=headers, timeout=30, json={"name": "datasets", "quota_gb": 100})
    if response.status_code != 201:
        raise DemoError(f"creating the volume answered {response.status_code}: {response.text[:300]}")
    volume = response.json()
    started = []
    for index, cluster in enumerate(clusters):
        response = requests.post(api, headers=headers, timeout=30, json={
            "name": f"smoke-{cluster['name']}", "image": "quay.io/jupyter/base-notebook:2024-12-02",
            "gpus": 1, "gpu_memory_mib": 2048, "gpu_cores": 20, "cluster": cluster["id"],
            **({"volumes": [volume["id"]]} if index == 0 else {}),
        })
        if response.status_code != 201:
            raise DemoError(f"starting a session on {cluster['name']} answered {response.status_code}: {response.text[:300]}")
        body = response.json()
        host = urlsplit(body["url"]).hostname
        if host != cluster["session_domain"]:
            raise DemoError(f"session {body['id']} has URL {body['url']}, not on {cluster['session_domain']}")
        started.append(body)

    def wait_for(session_id: str, phases: set[str], timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = requests.get(f"{api}/{session_id}", headers=headers, timeout=10).json()
            if body["phase"] in phases:
                return body
            if body["phase"] == "Failed":
                raise DemoError(f"session {session_id} failed: {body['message']}")
            _check_children(group)
            time.sleep(0.5)
        raise DemoError(f"session {session_id} did not reach {'/'.join(sorted(phases))} within {timeout:g} s (last: {body['phase']})")

    results = []
    for body in started:
        running = wait_for(body["id"], {"Running"})
        results.append({"id": body["id"], "cluster": body["cluster"], "url": body["url"], "node": running["node"],
                        "devices": running["devices"], "phase": running["phase"]})
    _say("smoke: " + ", ".join(f"{r['id']} Running on {r['node']} ({r['url']})" for r in results))
    opened = _smoke_open(url, headers, ingress_url, results[0], group, routing=clusters[0]["routing"])
    _say(f"smoke: {results[0]['id']} opened through the ingress of {clusters[0]['name']}: its page and the connect cookie")
    also_opened = {}  # every other session of a cluster in gateway-api mode: through Envoy Gateway
    for index, cluster in enumerate(clusters[1:], start=1):
        if cluster["routing"] == ROUTING_GATEWAY_API:
            also_opened[index] = _smoke_open(url, headers, ingress_url, results[index], group,
                                             routing=cluster["routing"])
            _say(f"smoke: {results[index]['id']} opened through Envoy Gateway on {cluster['name']} (HTTPRoute, "
                 "ext_authz's 307 with the connect cookie, then the cookie alone)")
    deadline = time.monotonic() + 60
    while True:
        volume = requests.get(f"{volumes_api}/{volume['id']}", headers=headers, timeout=10).json()
        if volume["status"] == "bound":
            break
        if time.monotonic() > deadline:
            raise DemoError(f"volume {volume['id']} is {volume['status']} ({volume['status_message']}), not bound, after 60 s")
        _check_children(group)
        time.sleep(0.5)
    _say(f"smoke: volume {volume['name']} ({volume['id']}) bound on {clusters[0]['name']} as PVC {volume['claim_name']}, "
         f"mounted by {results[0]['id']} at /data/{volume['name']}")
    results[0]["volume"] = {"id": volume["id"], "cluster": volume["cluster"], "status": volume["status"]}
    ledger_api, accruals_api = f"{url}/api/v1/billing/ledger", f"{url}/api/v1/billing/accruals"
    for result in results:
        # Usage is charged once per billing period (an hour); until then it accrues, held against the balance.
        deadline = time.monotonic() + 90
        while True:
            entries = requests.get(ledger_api, params={"session": result["id"]}, headers=headers, timeout=10).json()["results"]
            charges = [e for e in entries if e["kind"] == "charge"]
            accrued = requests.get(accruals_api, params={"session": result["id"]}, headers=headers, timeout=10).json()["results"]
            if charges or any(Decimal(a["amount"]) > 0 for a in accrued):
                break
            if time.monotonic() > deadline:
                raise DemoError(f"no usage charged or accrued for session {result['id']} after 90 s")
            _check_children(group)
            time.sleep(0.5)
        result["charged"] = str(sum(Decimal(e["amount"]) for e in charges) - sum(Decimal(a["amount"]) for a in accrued))
    account = requests.get(f"{url}/api/v1/billing/account", headers=headers, timeout=10).json()
    _say("smoke: usage billed (charged or accrued in the open period): " + ", ".join(f"{r['id']} {r['charged']} credits" for r in results)
         + f"; balance {account['balance']}, accrued {account['accrued']}")
    for result in results:
        requests.delete(f"{api}/{result['id']}", headers=headers, timeout=30)
    for result in results:
        result["phase"] = wait_for(result["id"], {"Terminated"})["phase"]
    for index, other in {0: opened, **also_opened}.items():
        deadline = time.monotonic() + 30
        while (refused := _through_ingress(ingress_url, other["link"]).status_code) not in (401, 403, 404):
            if time.monotonic() > deadline:
                raise DemoError(f"the link of the stopped session {results[index]['id']} still answers {refused}")
            time.sleep(0.5)
        _say(f"smoke: the link of the stopped {results[index]['id']} is refused ({refused})")
        results[index]["opened"] = {**{k: v for k, v in other.items() if k != "link"}, "refused_after_stop": refused}
    return results


def _smoke_metrics(internal_url: str, clusters: list[dict]) -> dict:
    """Scrape ``/metrics`` on the internal host; every GPU of every cluster must be there (``gshare_gpu_healthy``).

    Returns:
        ``{"gpus": {cluster name: GPUs listed}}``.

    Raises:
        DemoError: the scrape failed or a cluster's GPUs are missing.
    """
    from prometheus_client.parser import text_string_to_metric_families

    response = requests.get(f"{internal_url}/metrics", timeout=30)
    if response.status_code != 200:
        raise DemoError(f"GET /metrics answered {response.status_code}: {response.text[:300]}")
    listed: dict[str, int] = {c["name"]: 0 for c in clusters}
    for family in text_string_to_metric_families(response.text):
        if family.name == "gshare_gpu_healthy":
            for sample in family.samples:
                if sample.labels.get("cluster") in listed:
                    listed[sample.labels["cluster"]] += 1
    missing = [c["name"] for c in clusters if listed[c["name"]] != c["gpus"]]
    if missing:
        raise DemoError(f"/metrics lists {listed} GPUs; expected {[(c['name'], c['gpus']) for c in clusters]}")
    return {"gpus": listed}


def _expected(name: str) -> tuple[int, int]:
    expected = fleet.expected_inventory(name)
    return expected["nodes"], expected["gpus"]


def _kubeconfig(name: str, url: str, token: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": f"{name}-admin", "user": {"token": token}}],
        "contexts": [{"name": f"{name}-admin@{name}", "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": f"{name}-admin@{name}",
    }, sort_keys=False)
