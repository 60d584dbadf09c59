"""The operator token exchange (``POST /internal/v1/token``) is bounded: only in the token's refresh window, for a
token of at most the configured lifetime, throttled per cluster; and audited.

Tokens with chosen ``iat``/``exp`` are signed with the active key directly (:func:`signed`), so a token "in its
last quarter" needs no sleeping; the exchange service also takes ``now``.
"""

from __future__ import annotations

import logging
import time
import uuid

import jwt
import pytest
from django.conf import settings

from clusters.models import Cluster
from clusters.operator_token.tokens import (
    TokenRefreshThrottled,
    TokenRefreshTooEarly,
    operator_token_exchange,
    operator_token_mint,
    operator_token_refresh_after,
)
from identity.internal_jwt import OPERATOR_AUDIENCE, verify_internal_jwt
from identity.keys import signing_key_ensure
from operator_agent.token import Candidate, TokenRefresher
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

EMPTY_INVENTORY = {"nodes": []}


def signed(cluster: Cluster, *, iat: float, exp: float, gen: int | None = None) -> str:
    """An operator token for ``cluster`` with exactly these ``iat``/``exp``, signed by the active key."""
    key = signing_key_ensure()
    payload = {
        "iss": settings.GSHARE_JWT_ISSUER, "sub": f"operator:{cluster.public_id}", "aud": OPERATOR_AUDIENCE,
        "iat": int(iat), "nbf": int(iat), "exp": int(exp), "jti": uuid.uuid4().hex,
        "gen": cluster.credential_generation if gen is None else gen,
    }
    return jwt.encode(payload, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid})


def unverified(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def audits(caplog, action: str | None = None) -> list[dict]:
    return [r.audit for r in caplog.records if r.name == "gshare.audit" and (action is None or r.audit["action"] == action)]


def test_a_short_token_is_not_renewed_before_its_last_quarter(http_for, settings):
    """A ``--ttl 60`` token is not exchanged for a longer one at once (nor chained into ever new ones)."""
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id, ttl=60)
    response = http_for(token).post("/internal/v1/token")
    assert (response.status_code, response.json()["code"]) == (409, "token_refresh_too_early")
    body = response.json()
    assert "token" not in body and token not in response.text
    exp = unverified(token)["exp"]
    assert body["refresh_after"] and body["expires_at"]
    refresh_after = operator_token_refresh_after(unverified(token))
    assert exp - 60 / 4 - 3 <= refresh_after <= exp - 60 / 4  # the skew allowance is at most 1/20 of the life
    assert body["refresh_after"][:19] in response.json()["detail"]


def test_a_token_in_its_refresh_window_is_exchanged_for_one_of_at_most_the_configured_ttl(http_for, settings, caplog):
    settings.GSHARE_OPERATOR_TOKEN_TTL = 3600
    cluster = ClusterFactory()
    now = time.time()
    old = signed(cluster, iat=now - 30 * 86400 + 600, exp=now + 600)  # a 30-day token with 10 minutes left
    caplog.set_level(logging.INFO, logger="gshare.audit")

    response = http_for(old).post("/internal/v1/token")
    assert response.status_code == 200, response.text
    new = verify_internal_jwt(response.json()["token"], OPERATOR_AUDIENCE)
    assert new["exp"] - new["iat"] == 3600  # GSHARE_OPERATOR_TOKEN_TTL, not the old token's 30 days
    assert new["sub"] == f"operator:{cluster.public_id}"

    # The exchange is audited: cluster, both jti, generation; never a token.
    [line] = audits(caplog, "operator_token_exchange")
    assert line["cluster"] == cluster.public_id and line["actor"] == f"operator:{cluster.public_id}"
    assert (line["old_jti"], line["new_jti"], line["generation"]) == (unverified(old)["jti"], new["jti"], 1)
    assert old not in caplog.text and response.json()["token"] not in caplog.text

    # The fresh token is not in its window: it cannot be chained into another one right away.
    again = http_for(response.json()["token"]).post("/internal/v1/token")
    assert (again.status_code, again.json()["code"]) == (409, "token_refresh_too_early")


def test_the_window_matches_the_operators_refresher_exactly(settings):
    """Whatever its jitter, the operator asks inside the window; a little earlier (beyond the skew allowance) is refused."""
    settings.GSHARE_JWT_LEEWAY = 0
    cluster = ClusterFactory()
    base = time.time()
    iat, exp = base - 3000, base + 600
    token = signed(cluster, iat=iat, exp=exp)
    claims = unverified(token)
    for jitter in (0.0, 0.5, 0.999999):
        refresher = TokenRefresher(tokens=None, client=None, rng=lambda jitter=jitter: jitter)
        due = refresher.refresh_at(Candidate.of(token, "file"))
        issued = operator_token_exchange(cluster=cluster, claims=claims, now=due)
        assert issued.generation == 1
    life = exp - iat
    skew = 1  # max(GSHARE_JWT_LEEWAY, 1), under life / 20
    operator_token_exchange(cluster=cluster, claims=claims, now=exp - life / 4 - skew)
    with pytest.raises(TokenRefreshTooEarly) as early:
        operator_token_exchange(cluster=cluster, claims=claims, now=exp - life / 4 - skew - 1)
    assert early.value.status == 409 and early.value.extra["refresh_after"]


def test_the_skew_allowance_is_the_jwt_leeway_but_at_most_a_twentieth_of_the_life(settings):
    settings.GSHARE_JWT_LEEWAY = 30
    assert operator_token_refresh_after({"iat": 0, "exp": 3600}) == 3600 - 900 - 30
    assert operator_token_refresh_after({"iat": 0, "exp": 60}) == 60 - 15 - 3


@pytest.mark.django_db(transaction=True)
def test_exchanges_are_throttled_per_cluster(settings, caplog):
    settings.GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT = 3
    cluster, other = ClusterFactory(), ClusterFactory()
    now = 120 * (time.time() // 120) + 10  # 10 s into a minute: every call below falls in the same window
    claims = {"iat": now - 3000, "exp": now + 600, "jti": "a"}
    caplog.set_level(logging.INFO, logger="gshare.audit")
    for _ in range(3):
        operator_token_exchange(cluster=cluster, claims=claims, now=now)
    with pytest.raises(TokenRefreshThrottled) as throttled:
        operator_token_exchange(cluster=cluster, claims=claims, now=now + 5)
    assert (throttled.value.status, throttled.value.code, throttled.value.retry_after) == (429, "token_refresh_throttled", 45)
    with pytest.raises(TokenRefreshThrottled):
        operator_token_exchange(cluster=cluster, claims=claims, now=now + 6)
    assert len(audits(caplog, "operator_token_exchange_throttled")) == 1  # one line per minute, not per request
    operator_token_exchange(cluster=other, claims=claims, now=now)  # another cluster has its own budget
    operator_token_exchange(cluster=cluster, claims=claims, now=now + 60)  # the next minute


def test_too_early_attempts_count_too_and_429_carries_retry_after(http_for, settings):
    settings.GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT = 1
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    http = http_for(token)
    answers = [http.post("/internal/v1/token") for _ in range(3)]  # 3: a minute boundary may fall between two
    assert answers[0].json()["code"] == "token_refresh_too_early"
    throttled = next(r for r in answers if r.status_code == 429)
    assert throttled.json()["code"] == "token_refresh_throttled"
    assert 1 <= int(throttled.headers["Retry-After"]) <= 60 and throttled.json()["retry_after"] == int(throttled.headers["Retry-After"])


def test_a_burst_of_exchanges_is_refused_without_changing_the_cluster(http_for):
    cluster = ClusterFactory()
    http = http_for(operator_token_mint(cluster_id=cluster.public_id))
    codes = [http.post("/internal/v1/token").status_code for _ in range(25)]  # 25: even if a minute boundary falls in between
    assert codes[:10] == [409] * 10 and 429 in codes and set(codes) == {409, 429}
    cluster.refresh_from_db()
    assert cluster.credential_generation == 1
