"""What ``bench/fleet.py`` sets up around the simulation: the fleet's rows, the Celery worker and beat, CPU accounting.

Not a benchmark itself: ``bench/fleet.py`` imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import psutil
from _benchenv import ROOT, log

#: The chart's settings for every component (charts/gshare/values.yaml: ``database.connMaxAge``).
CHART_ENV = {"DATABASE_CONN_MAX_AGE": "60", "DJANGO_SETTINGS_MODULE": "gshare.settings", "GSHARE_LOG_LEVEL": "WARNING"}


def make_fleet(*, clusters: int, node_counts: list[int], researchers: int, apiserver, models, token_dir: Path) -> dict:
    """Create the clusters (connected, their kubeconfig pointing at ``apiserver``), one operator token each (written to
    ``token_dir``), the prices, the researchers with an API token and credits.

    Nodes and GPUs are not created here: each operator's first inventory snapshot creates them, as on a real attach.

    Returns:
        ``{"clusters": [(public id, token file)], "researchers": [(username, api token)]}``.
    """
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from billing.models import Price
    from billing.services import credit_grant
    from clusters.models import Cluster
    from clusters.operator_token.tokens import operator_token_mint
    from identity.tokens import api_token_create

    now = timezone.now()
    rows = Cluster.objects.bulk_create([
        Cluster(name=f"fleet-{i:03d}", apiserver_url=f"{apiserver.url}/c/{i}", kubeconfig=apiserver.kubeconfig(i),
                session_domain=f"c{i:03d}.fleet.gshare.test", status=Cluster.Status.CONNECTED, last_heartbeat_at=now)
        for i in range(clusters)
    ])
    token_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for i, cluster in enumerate(rows):
        path = token_dir / f"cluster-{i:03d}.jwt"
        path.write_text(operator_token_mint(cluster_id=cluster.public_id))
        made.append((cluster.public_id, str(path)))
    Price.objects.bulk_create([Price(gpu_model=model, credits_per_gpu_hour=Decimal(price)) for model, _, price in models]
                              + [Price(gpu_model="", credits_per_gpu_hour=Decimal("1.000000"))])
    User = get_user_model()
    users = User.objects.bulk_create([User(username=f"researcher-{u:03d}", password="!") for u in range(researchers)])
    people = []
    for user in users:
        credit_grant(user=user, amount=Decimal("1000000"), reason="fleet benchmark", idempotency_key=f"fleet-{user.username}",
                     created_by="api:bench")
        _, token = api_token_create(username=user.username, name="fleet")
        people.append((user.username, token))
    log(f"fleet: {clusters} clusters ({sum(node_counts)} nodes, {sum(node_counts) * 8} GPUs to report), {researchers} researchers")
    return {"clusters": made, "researchers": people}


def start_celery(kind: str, env: dict[str, str], logfile: Path, cwd: Path) -> subprocess.Popen:
    """``celery -A gshare worker --concurrency 2`` or ``celery -A gshare beat`` with django-celery-beat's scheduler, as
    the chart runs them (charts/gshare/templates/deployment-worker.yaml, deployment-beat.yaml)."""
    args = {"worker": ["worker", "--concurrency", "2", "--without-mingle", "--without-gossip"],
            "beat": ["beat", "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler", "--pidfile", ""]}[kind]
    command = [sys.executable, "-m", "celery", "-A", "gshare", *args, "--loglevel", "WARNING"]
    child_env = {**os.environ, **env, **CHART_ENV, "PYTHONPATH": str(ROOT)}
    with open(logfile, "wb") as out:
        return subprocess.Popen(command, cwd=cwd, env=child_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM (Celery's warm shutdown), SIGKILL after ``timeout`` seconds; only this process and its own children."""
    if process.poll() is not None:
        return
    children = []
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def database_server_pid() -> int | None:
    """The PostgreSQL postmaster's pid when it runs on this machine (the parent of this connection's backend), else None."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), inet_server_addr()")
        backend, address = cursor.fetchone()
    if address is not None and str(address) not in ("127.0.0.1", "::1"):
        return None
    try:
        parent = psutil.Process(backend).parent()
    except psutil.NoSuchProcess:
        return None
    return parent.pid if parent is not None and "postgres" in parent.name() else None


def _redis(redis_url: str):
    import redis

    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return redis.Redis(unix_socket_path=parts.path, db=int(dict(parse_qsl(parts.query)).get("db", 0)))
    return redis.Redis.from_url(redis_url)


def purge_broker(redis_url: str) -> int:
    """Delete Celery's queue keys (``celery``, ``unacked*``, ``_kombu.binding.*``) from the bench's Redis database, so
    no task of this run (or of a killed one) reaches a later run's worker. Returns how many keys were deleted."""
    client = _redis(redis_url)
    try:
        keys = [*client.scan_iter("_kombu.binding.*"), *client.scan_iter("unacked*"), *client.scan_iter("celery")]
        return client.delete(*keys) if keys else 0
    finally:
        client.close()


def redis_server_pid(redis_url: str) -> int | None:
    """The Redis server's pid (``INFO server``) when it runs on this machine, else None."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    client = _redis(redis_url)
    pid = int(client.info("server")["process_id"])
    client.close()
    return pid if psutil.pid_exists(pid) else None


class CpuMeter:
    """CPU seconds (user + system) of process groups between ``start()`` and ``stop()``.

    A group is a root process and its descendants. Each process counts its own time plus that of its children it
    reaped (``children_user``/``children_system``), so a descendant that exits mid-run (a PostgreSQL backend whose
    connection was closed) is counted by its parent: the total is the sum, over the processes alive at the end, of
    their increase since the start (or since they appeared), less the time of the exited ones had before the start.
    Call ``sample()`` every second or two so short-lived descendants are seen. ``own_only`` groups (the load generator:
    this process, whose children are the embedded servers, measured on their own) count the root alone.
    """

    def __init__(self, groups: dict[str, int | None], own_only: tuple[str, ...] = ()):
        self.groups = {name: pid for name, pid in groups.items() if pid is not None}
        self.own_only = set(own_only)
        self._first: dict[tuple[str, int], float] = {}
        self._last: dict[tuple[str, int], float] = {}
        self._alive: set[tuple[str, int]] = set()
        self._measuring = False
        self.started = self.stopped = 0.0  # time.monotonic() of start() and stop()

    def _times(self, name: str, pid: int) -> dict[int, float]:
        try:
            root = psutil.Process(pid)
            procs = [root] if name in self.own_only else [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        seen = {}
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            reaped = 0.0 if name in self.own_only else t.children_user + t.children_system
            seen[proc.pid] = t.user + t.system + reaped
        return seen

    def sample(self) -> None:
        """Read every group's processes now."""
        alive = set()
        for name, pid in self.groups.items():
            for child, seconds in self._times(name, pid).items():
                key = (name, child)
                alive.add(key)
                if self._measuring:
                    self._first.setdefault(key, 0.0)  # appeared during the run: all its time counts
                self._last[key] = seconds
        self._alive = alive

    def start(self) -> None:
        self.sample()
        self._first = {key: self._last[key] for key in self._alive}
        self._measuring = True
        self.started = time.monotonic()

    def stop(self) -> None:
        self.sample()
        self._measuring = False
        self.stopped = time.monotonic()

    def seconds(self) -> dict[str, float]:
        """CPU seconds per group over the measured window."""
        totals = dict.fromkeys(self.groups, 0.0)
        for key, first in self._first.items():
            name = key[0]
            totals[name] += (self._last[key] - first) if key in self._alive else -first
        return {name: max(0.0, value) for name, value in totals.items()}
