"""Serving the emulator: ``serve`` (an async context manager) and ``EmulatedCluster`` (a background thread)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import ssl
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import attrs
import kmock

from demo.emulator.common import is_loopback
from demo.emulator.controllers.host_facts import validate_host_facts, validate_hosts
from demo.emulator.resources import resource_key
from demo.emulator.server import KubeApiEmulator
from demo.emulator.tls import ServerCertificates, generate_certificates


@attrs.mutable
class _LoopbackServer(kmock.Server):
    """kmock's ``Server`` without its in-process aiohttp client and DNS interceptor, optionally over TLS.

    Those exist for tests that call the mock through aiohttp in the same loop; the interceptor patches
    aiohttp's resolver process-wide and must be exited in LIFO order, which breaks with several
    emulators in several threads. Here only the listening server (aiohttp ``RawTestServer``) is started,
    with ``ssl_context`` (then ``url`` is ``https://...``) or without (plain HTTP).
    """

    ssl_context: ssl.SSLContext | None = attrs.field(default=None, kw_only=True)

    async def __aenter__(self) -> _LoopbackServer:
        if self._managed_server is not None:
            raise RuntimeError("The server can be started/entered only once.")
        self._managed_server = self._server_cls(self.handler, host=self._host, port=self._port)
        if self.ssl_context is None:
            await self._managed_server.__aenter__()
        else:  # RawTestServer.__aenter__ cannot pass ``ssl``; start_server then sets the scheme to https
            await self._managed_server.start_server(loop=asyncio.get_running_loop(), ssl=self.ssl_context)
        self.handler.servers.append(self)
        return self

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.handler.servers.remove(self)
        assert self._managed_server is not None
        await self._managed_server.__aexit__(exc_type, exc_value, traceback)
        self._managed_server = None


@contextlib.asynccontextmanager
async def serve(objects: Iterable[Mapping[str, Any]] = (), *, version: dict[str, str] | None = None,
                token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                hosts: Mapping[str, Mapping[str, Any]] | None = None, tls: bool | ServerCertificates = False,
                **emulator_options: Any) -> AsyncIterator[tuple[KubeApiEmulator, str]]:
    """Serve an emulated apiserver in the running event loop.

    Args:
        objects: seed objects (see ``KubeApiEmulator.load``).
        version: the ``/version`` document (e.g. ``demo/data/k8s-objects/version.kubeadm-v1.32.3-arm64.json``).
        token: bearer token to require, or None.
        host: a loopback address (``127.0.0.1``, ``::1``, ``localhost``); anything else is refused.
        port: TCP port, 0 for a free one.
        hosts: host facts per node name (see ``KubeApiEmulator`` and ``HOST_FACTS``), or None.
        tls: False (default) for plain HTTP; True for HTTPS with freshly generated certificates for ``host``;
            or the ``ServerCertificates`` to present (from ``generate_certificates(host)``; pass them when the
            caller needs the CA, e.g. for a kubeconfig's ``certificate-authority-data``).
        **emulator_options: more ``KubeApiEmulator`` options (``history_limit``, ``keep_requests`` ...).

    Yields:
        ``(emulator, url)`` with ``url`` like ``http://127.0.0.1:41234`` (``https://...`` with TLS; no trailing
        slash).

    Raises:
        ValueError: a non-loopback host, a seed object the emulator cannot serve, or bad host facts.
    """
    if not is_loopback(host):
        raise ValueError(f"the emulator listens on loopback only, not {host!r}")
    if isinstance(tls, ServerCertificates):
        certificates: ServerCertificates | None = tls
    else:
        certificates = generate_certificates(host) if tls else None
    ssl_context = certificates.ssl_context() if certificates is not None else None
    emulator = KubeApiEmulator(server_version=version, token=token, hosts=validate_hosts(hosts),
                               ca_pem=certificates.ca_pem if certificates is not None else None, **emulator_options)
    emulator.load(objects)
    async with emulator, _LoopbackServer(emulator, host=host, port=port, ssl_context=ssl_context) as server:
        url = str(server.url).rstrip("/")
        emulator.start_controllers()  # the stand-ins act on what the seed holds, as on created objects
        try:
            yield emulator, url
        finally:
            await emulator.close_watches()


class EmulatedCluster:
    """An emulated apiserver running in a background thread with its own event loop.

    Usable from plain threads and pytest (no asyncio needed by the caller)::

        with EmulatedCluster(objects, version=version, token="t") as cluster:
            api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab"))

    With ``tls=True`` it serves HTTPS (``url`` is ``https://127.0.0.1:<port>``) with a CA generated at each
    ``start()``; ``kubeconfig()`` carries that CA, so clients verify the server, and client-go based ones (Helm,
    kubectl) send the bearer token, which they never do over plain HTTP.

    Args:
        objects: seed objects (dicts with ``apiVersion``, ``kind``, ``metadata``; see ``KubeApiEmulator.load``).
        version: the ``/version`` document (``major``, ``minor``, ``gitVersion`` ... as strings), or None for
            kmock's default.
        token: bearer token clients must send, or None to accept anonymous requests.
        host: loopback address to listen on.
        port: TCP port, 0 for a free one (see ``url``).
        pod_startup_seconds: see ``KubeApiEmulator`` (None: Pods stay ``Pending``).
        hosts: host facts per node name (``{"gpu-1": {"nvidia_pci": 1, "nvidia_smi": "GPU 0: ...", ...}}``, keys in
            ``HOST_FACTS``): what gShare's attach check pods find and what HAMi's device plugin registers (see
            ``KubeApiEmulator``); change them while running with ``set_host``.
        tls: serve HTTPS with a throwaway CA and server certificate generated at start (see
            ``generate_certificates``, ``ca_pem``) instead of plain HTTP.
        hami_monitor_scheme: the metric names of HAMi's vGPU monitor stand-in, ``current`` or ``legacy`` (see
            ``KubeApiEmulator``).

    Raises:
        ValueError: bad host facts.
    """

    def __init__(self, objects: list[dict], version: dict | None = None, token: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, *, pod_startup_seconds: float | None = None,
                 hosts: Mapping[str, Mapping[str, Any]] | None = None, tls: bool = False,
                 hami_monitor_scheme: str = "current") -> None:
        self._tls = tls
        self._hami_monitor_scheme = hami_monitor_scheme
        self._certificates: ServerCertificates | None = None
        self._pod_startup_seconds = pod_startup_seconds
        self._hosts = validate_hosts(hosts)
        self._objects = [copy.deepcopy(o) for o in objects]
        self._version = version
        self._token = token
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._emulator: KubeApiEmulator | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:41234`` or, with TLS,
        ``https://127.0.0.1:41234`` (no trailing slash)."""
        if self._url is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._url

    @property
    def tls(self) -> bool:
        """Whether the server speaks HTTPS (the ``tls`` argument)."""
        return self._tls

    @property
    def ca_pem(self) -> bytes | None:
        """PEM of the CA that signed the running server's certificate; None without TLS.

        Raises:
            RuntimeError: TLS mode and not started (the CA is generated at each start).
        """
        if not self._tls:
            return None
        if self._certificates is None or self._url is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._certificates.ca_pem

    @property
    def ca_data(self) -> str | None:
        """``ca_pem`` base64-encoded, as a kubeconfig's ``certificate-authority-data``; None without TLS."""
        pem = self.ca_pem
        return None if pem is None else base64.b64encode(pem).decode("ascii")

    @property
    def token(self) -> str | None:
        """The bearer token clients must send (None: no authentication)."""
        return self._token

    @property
    def emulator(self) -> KubeApiEmulator:
        """The underlying kmock emulator; touch it only from its loop (see ``call``)."""
        if self._emulator is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._emulator

    def start(self, timeout: float = 10.0) -> EmulatedCluster:
        """Start serving in a daemon thread; return once the port listens.

        Raises:
            RuntimeError: already started, or the server did not come up within ``timeout`` seconds.
            ValueError: a bad host or seed object (re-raised from the server thread).
        """
        if self._thread is not None:
            raise RuntimeError("the emulated cluster is already started")
        self._certificates = generate_certificates(self._host) if self._tls else None
        self._thread = threading.Thread(target=self._run, name=f"kube-emulator-{self._port or 'auto'}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the emulated cluster did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._objects, version=self._version, token=self._token, host=self._host,
                         port=self._port, pod_startup_seconds=self._pod_startup_seconds,
                         hosts=self._hosts, tls=self._certificates or False,
                         hami_monitor_scheme=self._hami_monitor_scheme) as (emulator, url):
            self._emulator, self._url = emulator, url
            self._ready.set()
            await self._stop.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        self._thread = None
        self._url = None
        self._certificates = None

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def call(self, coro_fn: Any, *args: Any, timeout: float = 10.0) -> Any:
        """Run ``coro_fn(*args)`` (a coroutine function) in the server's loop and return its result."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("the emulated cluster is not started")
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(timeout)

    def kubeconfig(self, name: str) -> dict:
        """A kubeconfig dict for this server.

        Args:
            name: used as the cluster, user and context name; the context is ``current-context``.

        Returns:
            ``{"apiVersion": "v1", "kind": "Config", "current-context": name, "clusters": [...], "users": [...],
            "contexts": [...]}`` with ``server`` = ``url``, with TLS the CA as ``certificate-authority-data``, and
            the user's ``token`` (when one is set).
        """
        user: dict[str, Any] = {"token": self._token} if self._token is not None else {}
        cluster: dict[str, Any] = {"server": self.url}
        if self._tls:
            cluster["certificate-authority-data"] = self.ca_data
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "current-context": name,
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        }

    def objects_of(self, plural: str, group: str = "", version: str = "v1") -> list[dict]:
        """Current objects of a resource (deep copies, sorted by namespace/name), for assertions.

        Args:
            plural: resource name, e.g. ``nodes``.
            group: API group, ``""`` for core.
            version: API version.
        """
        async def snapshot() -> list[dict]:
            emulator = self.emulator
            spec = emulator._specs.get(resource_key(group, version, plural))
            if spec is None:
                return []
            async with emulator._lock:
                return copy.deepcopy(emulator.live_objects(spec))

        return self.call(snapshot)

    def requests_seen(self) -> list[dict]:
        """Requests the server has received so far, oldest first (the last 1000 are kept).

        Returns:
            ``[{"method": "GET", "path": "/api/v1/nodes", "query": {"labelSelector": "gpu=on"}}, ...]``;
            ``[]`` before ``start()``.
        """
        if self._thread is None:
            return []

        async def snapshot() -> list[dict]:
            return [{"method": str(r.method.value), "path": r.url.path, "query": dict(r.params)}
                    for r in list(self.emulator)]

        return self.call(snapshot)

    def add(self, obj: dict) -> dict:
        """Create or replace an object from any thread (watchers get ADDED/MODIFIED).

        Before ``start()`` the object is added to the seed. ``status`` is kept as given.

        Returns:
            The stored object with the emulator's metadata (before start: a copy of ``obj``).
        """
        if self._thread is None:
            self._objects.append(copy.deepcopy(obj))
            return copy.deepcopy(obj)
        return self.call(self.emulator.put_object, obj)

    @property
    def hosts(self) -> dict[str, dict[str, Any]]:
        """A copy of the host facts per node name (as given and changed with ``set_host``)."""
        return copy.deepcopy(self._hosts)

    def set_host(self, node: str, facts: Mapping[str, Any] | None) -> None:
        """Replace a node's host facts from any thread (None: forget them; before ``start()``: for the start).

        Check pods created afterwards see the new facts, and HAMi's device plugin stand-in registers the node if
        it now can (see ``KubeApiEmulator.set_host``): e.g. "install" the driver on a node, then re-run the checks.

        Raises:
            ValueError: bad facts (see ``HOST_FACTS``).
        """
        checked = None if facts is None else validate_host_facts(node, facts)
        if checked is None:
            self._hosts.pop(node, None)
        else:
            self._hosts[node] = checked
        if self._thread is not None:
            async def apply() -> None:
                self.emulator.set_host(node, checked)

            self.call(apply)

    def pod_log(self, namespace: str, name: str) -> str | None:
        """The log of a live Pod (``""`` before it has one), or None when there is no such Pod."""
        async def read() -> str | None:
            return self.emulator.pod_log(namespace, name)

        return self.call(read)

    def set_gpu_activity(self, namespace: str, name: str, state: str) -> dict[str, Any]:
        """Make a pod ``busy`` or ``idle`` on its HAMi GPUs from any thread (see ``KubeApiEmulator.set_gpu_activity``).

        Raises:
            KeyError: no such pod. ValueError: another state.
        """
        async def apply() -> dict[str, Any]:
            return self.emulator.set_gpu_activity(namespace, name, state)

        return self.call(apply)

    def set_hami_monitor(self, node: str, mode: str) -> dict[str, Any]:
        """Make a node's vGPU monitor ``ok``, ``down`` or ``hang`` from any thread (see
        ``KubeApiEmulator.set_hami_monitor``).

        Raises:
            KeyError: no such node. ValueError: another mode.
        """
        async def apply() -> dict[str, Any]:
            return self.emulator.set_hami_monitor(node, mode)

        return self.call(apply)
