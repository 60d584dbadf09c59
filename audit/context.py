"""Who is acting: the actor of the audit rows written while a request, a command or a beat task runs.

One ``contextvars.ContextVar`` holds the current :class:`Actor`. It is set

* for HTTP by ``audit.middleware.AuditActorMiddleware`` (:func:`request_scope`): ``api:<user>`` under ``/api/``,
  ``operator:<cluster id>`` under ``/internal/``, ``console:<user>`` elsewhere (the console); the source address is
  ``REMOTE_ADDR``. The user is read when a row is written, not when the request arrives, because DRF
  authenticates inside the view (it puts the user it found on the underlying Django request);
* for management commands by :func:`command_actor` (a decorator of ``handle``): ``command:<name>``;
* for Celery tasks sent by beat (``django-celery-beat`` puts ``periodic_task_name`` in their headers) by the
  ``task_prerun`` handler below: ``beat:<task name>``. A task queued while an actor was set (a request stopping a
  session queues the deletion) carries that actor in a header and runs as it.

Outside all of these the actor is ``system``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

#: Actor of a service called outside a request, a command and a task (a shell, a test).
SYSTEM = "system"
#: Celery message header that carries the actor of whoever queued a task.
ACTOR_HEADER = "gshare_audit_actor"


@dataclass(frozen=True)
class Actor:
    """The current actor: a fixed name, or a request whose user is read when a row is written.

    Attributes:
        name: ``command:<name>``, ``beat:<task>`` ... ("" when ``request`` decides).
        request: the Django ``HttpRequest`` being served, or None.
    """

    name: str = ""
    request: object | None = None

    def resolve(self) -> str:
        """The actor string (see the module docstring)."""
        if self.request is None:
            return self.name or SYSTEM
        return _request_actor(self.request)

    @property
    def source_address(self) -> str | None:
        """``REMOTE_ADDR`` of the request, or None outside HTTP."""
        if self.request is None:
            return None
        return self.request.META.get("REMOTE_ADDR") or None


_current: ContextVar[Actor | None] = ContextVar("gshare_audit_actor", default=None)


def _username(user) -> str:
    if user is None or not getattr(user, "is_authenticated", False):
        return "anonymous"
    return user.get_username()


def _request_actor(request) -> str:
    path = request.path_info or ""
    user = getattr(request, "user", None)
    if path.startswith("/internal/"):
        cluster = getattr(user, "cluster", None)
        return f"operator:{cluster.public_id}" if cluster is not None else "operator:unknown"
    prefix = "api" if path.startswith("/api/") else "console"
    return f"{prefix}:{_username(user)}"


def current() -> Actor | None:
    """The current :class:`Actor`, or None outside any scope."""
    return _current.get()


def current_actor() -> str:
    """The current actor string (``system`` outside any scope)."""
    actor = _current.get()
    return actor.resolve() if actor is not None else SYSTEM


@contextlib.contextmanager
def actor_scope(name: str, *, keep_outer: bool = False) -> Iterator[None]:
    """Run a block as ``name`` (``command:<name>``, ``beat:<task>`` ...).

    Args:
        name: the actor string.
        keep_outer: leave an actor already set in place (a command called by another command keeps the outer one).
    """
    if keep_outer and _current.get() is not None:
        yield
        return
    token = _current.set(Actor(name=name))
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def request_scope(request) -> Iterator[None]:
    """Run the handling of an HTTP request with ``request`` as the actor (user and ``REMOTE_ADDR`` read lazily)."""
    token = _current.set(Actor(request=request))
    try:
        yield
    finally:
        _current.reset(token)


def command_actor(handle):
    """Decorate a management command's ``handle``: what it does is recorded as ``command:<command name>``.

    A command run by another command (``call_command`` inside ``handle``) keeps the outer command as the actor.
    """

    @functools.wraps(handle)
    def wrapper(self, *args, **options):
        name = type(self).__module__.rsplit(".", 1)[-1]
        with actor_scope(f"command:{name}", keep_outer=True):
            return handle(self, *args, **options)

    return wrapper


# --------------------------------------------------------------------------- Celery

_task_tokens: dict[str, object] = {}


def _header(request, name: str):
    value = getattr(request, name, None)  # a worker merges custom headers into the request
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def _before_publish(sender=None, headers=None, **kwargs) -> None:
    """Carry the current actor to the task being queued (a header; nothing when no actor is set)."""
    actor = _current.get()
    if actor is not None and headers is not None and ACTOR_HEADER not in headers:
        headers[ACTOR_HEADER] = actor.resolve()


def _task_prerun(task_id=None, task=None, **kwargs) -> None:
    """Set the actor of a task: ``beat:<task>`` when beat sent it, else the actor that queued it, if any."""
    request = getattr(task, "request", None)
    if request is None:
        return
    if _header(request, "periodic_task_name"):
        name = f"beat:{task.name}"
    else:
        name = _header(request, ACTOR_HEADER)
        if not name or getattr(request, "is_eager", False):
            return  # an eager task runs in its caller's context already
    _task_tokens[task_id] = _current.set(Actor(name=name))


def _task_postrun(task_id=None, **kwargs) -> None:
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        _current.reset(token)


def connect_celery_signals() -> None:
    """Connect the Celery handlers above (``AuditConfig.ready``); safe to call twice."""
    from celery import signals

    signals.before_task_publish.connect(_before_publish, dispatch_uid="gshare-audit-publish", weak=False)
    signals.task_prerun.connect(_task_prerun, dispatch_uid="gshare-audit-prerun", weak=False)
    signals.task_postrun.connect(_task_postrun, dispatch_uid="gshare-audit-postrun", weak=False)
