"""kube-controller-manager's tokens controller: a ``kubernetes.io/service-account-token`` Secret gets its ServiceAccount's
token (``data.token``, ``data.namespace``, ``data.ca.crt`` with TLS, the ``kubernetes.io/service-account.uid``
annotation) right after it is created, in a write of its own (``MODIFIED``), as in a cluster: the create answer never
carries the token, so a credential allowed to create Secrets but not to read them cannot mint itself a token. A
deleted ServiceAccount's token Secrets are deleted.
"""

from __future__ import annotations

import copy

from demo.emulator.controllers import Controller
from demo.emulator.store import StoreEvent

SERVICE_ACCOUNT_TOKEN_TYPE = "kubernetes.io/service-account-token"
SERVICE_ACCOUNT_NAME_ANNOTATION = "kubernetes.io/service-account.name"
SERVICE_ACCOUNT_UID_ANNOTATION = "kubernetes.io/service-account.uid"


class TokensController(Controller):
    """Fills created ServiceAccount token Secrets (``KubeApiEmulator.token_secret_data`` makes the data)."""

    def on_event(self, event: StoreEvent) -> None:
        """A Secret of the token type added without a token: fill it in a task of its own. A ServiceAccount deleted:
        delete its token Secrets (as ``TokensController.deleteTokens`` does)."""
        if event.kind == ("", "serviceaccounts") and event.type == "DELETED":
            meta = event.object["metadata"]
            self.api.spawn(self._delete_tokens(meta["namespace"], meta["name"], meta.get("uid") or ""),
                           f"tokens-delete-{meta['namespace']}-{meta['name']}")
            return
        if event.kind != ("", "secrets") or event.type != "ADDED" or event.object.get("type") != SERVICE_ACCOUNT_TOKEN_TYPE:
            return
        meta = event.object["metadata"]
        self.api.spawn(self._fill(meta["namespace"], meta["name"]), f"tokens-{meta['namespace']}-{meta['name']}")

    async def _delete_tokens(self, namespace: str, account: str, uid: str) -> None:
        api = self.api
        spec = api.served("", "v1", "secrets")
        async with api._lock:
            for secret in api.live_objects(spec, namespace):
                annotations = secret["metadata"].get("annotations") or {}
                if (secret.get("type") == SERVICE_ACCOUNT_TOKEN_TYPE
                        and annotations.get(SERVICE_ACCOUNT_NAME_ANNOTATION) == account
                        and annotations.get(SERVICE_ACCOUNT_UID_ANNOTATION, uid) == uid):
                    await api.delete_object(spec, namespace, secret["metadata"]["name"], dry_run=False)

    def start(self) -> None:
        """Fill the token Secrets of a seed."""
        for secret in self.api.live_objects(self.api.served("", "v1", "secrets")):
            if secret.get("type") == SERVICE_ACCOUNT_TOKEN_TYPE and not (secret.get("data") or {}).get("token"):
                meta = secret["metadata"]
                self.api.spawn(self._fill(meta["namespace"], meta["name"]), f"tokens-{meta['namespace']}-{meta['name']}")

    async def _fill(self, namespace: str, name: str) -> None:
        api = self.api
        spec = api.served("", "v1", "secrets")
        async with api._lock:
            current = api.get_object(spec, namespace, name)
            if current is None:
                return
            filled = copy.deepcopy(current)
            if not api.fill_token_secret(filled):
                return
            await api.write_object(spec, filled, current)
