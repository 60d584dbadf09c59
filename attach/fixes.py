"""What ``attach_cluster`` prints after a failure: the fix for that failure and the command to run again.

Each fix is a command (or a short list of them) that repairs exactly the failure it follows, written for the
files and names of this attach (the kubeconfig path, its cluster and user entries, the registered cluster);
``then re-run: <command>`` repeats the command as the user ran it: ``manage.py attach_cluster`` or the
``hack/attach-cluster.sh`` wrapper, which says so in ``GSHARE_ATTACH_INVOKED_AS``, after the ``GSHARE_*`` variables
the first run had (``GSHARE_LOOPBACK_ALLOWLIST=... python manage.py attach_cluster ...``): a variable that holds a
secret is written as a reference to itself (``GSHARE_API_TOKEN="$GSHARE_API_TOKEN"``), never with its value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import yaml

from core.exceptions import ApplicationError

COMMAND = "attach_cluster"
#: Set by ``hack/attach-cluster.sh`` to the path it was run as (``$0``), so fixes name the wrapper, not manage.py.
INVOKED_AS_ENV = "GSHARE_ATTACH_INVOKED_AS"


_ASSIGNMENT = re.compile(r"GSHARE_[A-Z0-9_]+=")
#: Set by the wrapper and manage.py themselves on every run: not part of what the user typed.
_SET_BY_THE_COMMAND = frozenset({INVOKED_AS_ENV, "GSHARE_CLIENT_ONLY"})
#: Words in a variable's name that mark its value as a secret (an API token, a password, a key).
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSPHRASE", "KEY", "CREDENTIAL")


def rerun_environment(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The ``GSHARE_*`` variables of ``environ`` as ``NAME=value`` words for the re-run line, sorted by name;
    ``NAME="$NAME"`` for a variable whose name says it holds a secret (its value is never printed)."""
    words = []
    for name, value in sorted(environ.items()):
        if not name.startswith("GSHARE_") or name in _SET_BY_THE_COMMAND or not _ASSIGNMENT.fullmatch(name + "="):
            continue
        secret = any(word in name for word in _SECRET_WORDS)
        words.append(f'{name}="${name}"' if secret else f"{name}={value}")
    return tuple(words)


def shell_line(words: Sequence[str]) -> str:
    """``words`` as one shell line: each quoted (``shlex``), except a secret's ``NAME="$NAME"`` reference, which the
    shell must expand."""
    out = []
    for word in words:
        name = word.partition("=")[0]
        if _ASSIGNMENT.match(word) and word == f'{name}="${name}"':
            out.append(word)
        elif _ASSIGNMENT.match(word):
            out.append(f"{name}={shlex.quote(word.partition('=')[2])}")
        else:
            out.append(shlex.quote(word))
    return " ".join(out)


def invocation(*, argv: Sequence[str], orig_argv: Sequence[str], environ: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The command line to repeat in "then re-run:" and the prefix that runs other manage.py commands.

    Args:
        argv: ``sys.argv`` (``[<manage.py path>, "attach_cluster", *flags]`` when run from a shell).
        orig_argv: ``sys.orig_argv``: the interpreter's own command line as typed (``python manage.py ...``).
        environ: the environment (``GSHARE_ATTACH_INVOKED_AS``; the ``GSHARE_*`` variables, see
            :func:`rerun_environment`).

    Returns:
        ``(rerun, manage)``: ``rerun`` (words for :func:`shell_line`: the ``GSHARE_*`` assignments, then the command) is
        empty when the command was not run from a shell (``call_command``); ``manage`` is e.g. ``("python", "manage.py")``.
    """
    if len(argv) < 2 or argv[1] != COMMAND:
        return (), ("python", "manage.py")
    flags = tuple(argv[2:])
    wrapper = environ.get(INVOKED_AS_ENV, "")
    if COMMAND in orig_argv:
        manage = tuple(orig_argv[:list(orig_argv).index(COMMAND)])
    else:  # e.g. an executable manage.py started through its shebang line
        manage = ("python", argv[0])
    variables = rerun_environment(environ)
    if wrapper:
        return (*variables, wrapper, *flags), manage
    return (*variables, *manage, COMMAND, *flags), manage


def rerun_with(rerun: Sequence[str], flag: str, value: str) -> str:
    """``rerun`` with ``flag``'s value replaced by ``value`` (added when absent), as a shell line."""
    out, skip, found = [], False, False
    for part in rerun:
        if skip:
            out.append(value)
            skip = False
        elif part == flag:
            out.append(part)
            skip = found = True
        elif part.startswith(flag + "="):
            out.append(f"{flag}={value}")
            found = True
        else:
            out.append(part)
    if not rerun:
        return f"the same {COMMAND} command with {flag} {shlex.quote(value)}"
    if not found:
        out += [flag, value]
    return shell_line(out)


def _current_entries(text: str) -> dict:
    """The current context's cluster and user entries: ``{"cluster", "user", "server", "token_file"}`` ("" if unknown).

    Only called for kubeconfigs ``validate_kubeconfig`` parsed before refusing them (its alias checks passed).
    """
    found = {"cluster": "", "user": "", "server": "", "token_file": ""}
    try:
        data = yaml.safe_load(text)
        context = next(c["context"] for c in data["contexts"] if c.get("name") == data["current-context"])
        found["cluster"], found["user"] = str(context.get("cluster") or ""), str(context.get("user") or "")
        cluster = next((c["cluster"] for c in data.get("clusters") or [] if c.get("name") == found["cluster"]), {})
        user = next((u["user"] for u in data.get("users") or [] if u.get("name") == found["user"]), {})
        found["server"], found["token_file"] = str(cluster.get("server") or ""), str(user.get("tokenFile") or "")
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, StopIteration):
        pass
    return found


def kubeconfig_fix(error: ApplicationError, *, text: str, path: str) -> str:
    """The fix for a kubeconfig ``validate_kubeconfig`` refused (``kubeconfig_*`` codes), editing ``path`` in place.

    Args:
        error: the ``KubeconfigError``.
        text: the kubeconfig's text.
        path: the ``--kubeconfig`` path, as given.
    """
    kc = shlex.quote(path)
    if error.code == "kubeconfig_localhost":
        entries = _current_entries(text)
        name = shlex.quote(entries["cluster"] or "<cluster>")
        try:
            port = urlsplit(entries["server"]).port or 6443
        except ValueError:
            port = 6443
        return (
            "replace the loopback server address with an address of the cluster's apiserver that the control plane can reach:\n"
            f"kubectl --kubeconfig {kc} config set-cluster {name} --server=https://<reachable-host>:{port}\n"
            "for k3s, take /etc/rancher/k3s/k3s.yaml from the server node with 127.0.0.1 replaced by that node's address:\n"
            f"ssh <server-node> sudo cat /etc/rancher/k3s/k3s.yaml | sed 's/127.0.0.1/<server-node-address>/' > {kc}"
        )
    if error.code == "kubeconfig_local_file":
        entries = _current_entries(text)
        if entries["token_file"]:
            user = shlex.quote(entries["user"] or "<user>")
            return (
                "put the token itself into the kubeconfig instead of its file:\n"
                f"kubectl --kubeconfig {kc} config set-credentials {user} --token=\"$(cat {shlex.quote(entries['token_file'])})\"\n"
                f"kubectl --kubeconfig {kc} config unset users.{user}.tokenFile"
            )
        return (
            "inline the certificate and key files into the kubeconfig:\n"
            f"kubectl --kubeconfig {kc} config view --raw --minify --flatten > {kc}.inline && mv {kc}.inline {kc}"
        )
    if error.code == "kubeconfig_exec_forbidden":
        return (
            "give the kubeconfig a ServiceAccount token instead of the exec/auth-provider plugin (run these where your kubectl "
            "reaches the cluster; this token is also the control plane's credential, so it must not expire):\n"
            "kubectl -n kube-system create serviceaccount gshare-attach\n"
            "kubectl create clusterrolebinding gshare-attach --clusterrole=cluster-admin --serviceaccount=kube-system:gshare-attach\n"
            "kubectl -n kube-system create -f - <<'YAML'\n"
            "{apiVersion: v1, kind: Secret, type: kubernetes.io/service-account-token, metadata: {name: gshare-attach-token, "
            "annotations: {kubernetes.io/service-account.name: gshare-attach}}}\n"
            "YAML\n"
            f"kubectl --kubeconfig {kc} config set-credentials gshare-attach "
            "--token=\"$(kubectl -n kube-system get secret gshare-attach-token -o jsonpath='{.data.token}' | base64 -d)\"\n"
            f"kubectl --kubeconfig {kc} config set-context --current --user=gshare-attach"
        )
    if "current-context" in error.detail or "current context" in error.detail:
        return (
            "choose the GPU cluster's context in the kubeconfig:\n"
            f"kubectl --kubeconfig {kc} config get-contexts\n"
            f"kubectl --kubeconfig {kc} config use-context <context>"
        )
    return (
        "export the kubeconfig again with its data (not redacted) and credentials inline, where your kubectl reaches the cluster:\n"
        f"kubectl config view --raw --minify --flatten > {kc}"
    )


def registration_fix(error: ApplicationError, *, rerun: Sequence[str], session_domain: str = "",
                     cluster_lookup: Callable[[str], dict | None] = lambda cluster_id: None) -> str:
    """The fix for a refusal of the registration step (``POST`` / ``PATCH /api/v1/clusters``).

    Args:
        error: the refusal, with the error body's extra fields in ``extra`` (``cluster``, ``sessions``).
        rerun: the command line the user ran (empty when unknown).
        session_domain: the cluster's current ``session_domain`` (``cluster_has_live_sessions``).
        cluster_lookup: a ``clu_...`` id -> that cluster as the API shows it (``{"id", "name", ...}``) or None; the
            attach passes ``GET /api/v1/clusters/{id}``.
    """
    other = cluster_lookup(str(error.extra["cluster"])) if error.extra.get("cluster") else None
    code = error.code
    if code == "cluster_already_registered" and other is not None:
        return (
            f"this cluster is already registered as {other['name']} ({other['id']}). To repair or update that registration, run:\n"
            f"{rerun_with(rerun, '--name', other['name'])}\n"
            f"or, to register it under the new name, deregister it first: DELETE /api/v1/clusters/{other['id']} (staff API token)"
        )
    if code == "session_domain_taken" and other is not None:
        return (
            f"cluster {other['name']} ({other['id']}) serves sessions at that hostname: pass another --session-domain (its DNS "
            "name must point at --ingress-node), or first give the other cluster another one: "
            f"PATCH /api/v1/clusters/{other['id']} {{\"session_domain\": \"<hostname>\"}}"
        )
    if code == "cluster_has_live_sessions":
        listed = error.extra.get("sessions")
        sessions = " ".join(str(s) for s in (listed if isinstance(listed, list) else [])[:20]) or "<id>"
        keep = f"\nor keep the current session domain: {rerun_with(rerun, '--session-domain', session_domain)}" if session_domain else ""
        return f"stop the cluster's live sessions first (DELETE /api/v1/sessions/<id> for each of: {sessions}), or wait until they end{keep}"
    if code == "name_taken":
        return "pass another --name, or deregister the cluster of that name first: DELETE /api/v1/clusters/<id> (GET /api/v1/clusters lists them)"
    if code == "cluster_unreachable":
        return "make the apiserver reachable from the control plane: curl -k --max-time 10 <server>/version (server of --kubeconfig)"
    if code == "cluster_auth_failed":
        return "use a kubeconfig with cluster-admin rights: kubectl auth can-i '*' '*' --all-namespaces"
    if code == "runtime_class_missing":
        return "the RuntimeClass nvidia was deleted after step 3 created it: check kubectl get runtimeclass nvidia (the re-run creates it again)"
    if code == "hami_missing":
        return ("HAMi's device plugin DaemonSet is gone after step 4 installed it: check "
                "kubectl -n kube-system get daemonsets -l app.kubernetes.io/component=hami-device-plugin (the re-run installs it again)")
    if code == "different_cluster":
        return "pass the kubeconfig of the cluster registered under --name, or pick another --name for this cluster"
    return f"do what the message says (code {code}, docs/errors.md)"


def unreadable_file_reason(error: Exception) -> str:
    """Why a ``--kubeconfig``/``--storage-values``/``--values`` file could not be used, in a few words (``not UTF-8
    text``, ``not valid YAML (line 3)``, the OS's reason, or the ``ValueError``'s message)."""
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        return "not valid YAML" + (f" (line {mark.line + 1})" if mark is not None else "")
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


def unreadable_file_fix(error: Exception, *, path: str, flag: str) -> str:
    """The fix for a ``--kubeconfig`` or ``--storage-values`` file that could not be used as text (or YAML).

    Args:
        error: what reading or parsing raised: ``OSError``, ``UnicodeDecodeError``, ``ValueError`` (too large) or
            ``yaml.YAMLError``.
        path: the path as given.
        flag: ``--kubeconfig`` or ``--storage-values``.
    """
    quoted = shlex.quote(path)
    kubeconfig = flag == "--kubeconfig"
    if isinstance(error, OSError):
        return (f"pass the path of a file this user can read (a relative path is read from the directory the command runs in): "
                f"ls -l {quoted}")
    if isinstance(error, UnicodeDecodeError):
        if kubeconfig:
            return f"export the kubeconfig as text: kubectl config view --raw --minify --flatten > {quoted}"
        return f"save the values as UTF-8 text: iconv -f <its encoding> -t UTF-8 {quoted} > {quoted}.utf8 && mv {quoted}.utf8 {quoted}"
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1} of " if mark is not None else ""
        return f"correct the YAML at {where}{quoted} (democratic-csi's examples/*-nfs.yaml layout, see docs/attach.md#storage)"
    if kubeconfig:  # too large
        return f"export only this cluster's context: kubectl config view --raw --minify --flatten > {quoted}"
    return f"pass only democratic-csi's values in {quoted} (its examples/*-nfs.yaml are a few KiB)"
