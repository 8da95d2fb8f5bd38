"""Who may use the job and benchmark endpoints: the optional API token, job owners, rate limits.

Torch-free; used by the demo (each request) and by `arrcoc submit/job`. docs/security.md says what
this protects and what it does not.

- **Token** (`ARRCOC_ACCESS__API_TOKEN`): when set, the job kinds in `ARRCOC_ACCESS__TOKEN_SCOPE` need it. It is
  compared in constant time and never stored: jobs and Redis hold only its SHA-256. Without a
  token, benchmarks are closed unless `ARRCOC_ACCESS__OPEN_BENCHMARKS` opens them to anyone.
- **Owner**: every job made through the demo or the CLI records who made it — the token's hash,
  or else the browser (a random id in a cookie) or the Gradio session. Another owner asking for
  that id gets "No job", the same answer as for an id never issued.
- **Rate limit**: a sliding window of requests per client and minute (interactive and job
  submissions counted apart), in the process that serves the demo.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re
import threading
import time

from ..errors import AccessDenied
from ..settings import Settings

_CLIENT_ID = re.compile(r"^[0-9a-f]{32}$")


def token_owner(token: str) -> str:
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def check_token(settings: Settings, kind: str, given: object) -> str | None:
    """The owner a valid token gives (None: no token given and none needed); AccessDenied when this
    kind of job needs the token and `given` is not it."""
    if given is not None and not isinstance(given, str):
        raise AccessDenied("The API token must be text.")
    given = (given or "").strip()
    expected = settings.access.api_token
    if expected and given:
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise AccessDenied("That API token is not valid on this server.")
        return token_owner(given)
    if settings.access.token_required(kind):
        raise AccessDenied(
            f"{kind.capitalize()} jobs on this server need the API token (ARRCOC_ACCESS__API_TOKEN):"
            " enter it in the token field, or send it in the X-Arrcoc-Token header."
        )
    if kind == "bench" and not expected and not settings.access.open_benchmarks:
        raise AccessDenied(
            "Benchmarks are closed on this server: a benchmark holds the device for minutes, and no"
            " API token says who may run one. The operator opens them with ARRCOC_ACCESS__API_TOKEN (token"
            " holders benchmark) or ARRCOC_ACCESS__OPEN_BENCHMARKS=1 (anyone)."
        )
    return None


def anonymous_owner(client_id: str | None, session: str | None) -> str:
    """A browser's own id (a random cookie that survives a refresh) when it sent one, else the session."""
    if client_id and _CLIENT_ID.match(client_id):
        return "client:" + client_id
    return "session:" + hashlib.sha256((session or "").encode()).hexdigest()[:32]


class RateLimiter:
    """At most `per_minute` events per key in any 60 s window (0: no limit). Memory is bounded:
    keys idle for a minute are forgotten, and at most `max_keys` are tracked."""

    def __init__(self, per_minute: int, max_keys: int = 100_000):
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._events: dict[str, collections.deque[float]] = {}

    def check(self, key: str, what: str = "requests") -> None:
        if self.per_minute <= 0:
            return
        now = time.monotonic()
        with self._lock:
            q = self._events.get(key)
            if q is None:
                if len(self._events) >= self.max_keys:
                    self._forget_idle(now)
                q = self._events[key] = collections.deque()
            while q and q[0] <= now - 60:
                q.popleft()
            if len(q) >= self.per_minute:
                wait = 60 - (now - q[0])
                raise AccessDenied(
                    f"Too many {what} from this client ({self.per_minute} a minute); try again in"
                    f" {max(wait, 1):.0f} s."
                )
            q.append(now)

    def _forget_idle(self, now: float) -> None:
        for k in [k for k, q in self._events.items() if not q or q[-1] <= now - 60]:
            del self._events[k]
        while len(self._events) >= self.max_keys:  # all busy: drop the oldest
            self._events.pop(next(iter(self._events)))


# -- the token as Redis holds it, for `arrcoc submit/job` -------------------------------------------
def token_key(settings: Settings) -> str:
    return f"{settings.service.redis_prefix}:auth:token-sha256"


def publish_token(redis_client, settings: Settings) -> None:
    """The server side (worker, demo) writes the token's hash where the CLI can check a token
    against it; without a token the key is removed."""
    if settings.access.api_token:
        redis_client.set(token_key(settings), hashlib.sha256(settings.access.api_token.encode()).hexdigest())
    else:
        redis_client.delete(token_key(settings))


def cli_owner(redis_client, settings: Settings) -> str | None:
    """`arrcoc submit/job`: the owner its ARRCOC_ACCESS__API_TOKEN gives; AccessDenied when the deployment
    requires a token (its hash is in Redis) and this one is missing or wrong."""
    want = redis_client.get(token_key(settings))
    want = want.decode() if isinstance(want, bytes) else want
    token = settings.access.api_token
    if want:
        have = hashlib.sha256(token.encode()).hexdigest() if token else ""
        if not hmac.compare_digest(have.encode(), want.encode()):
            raise AccessDenied(
                "This deployment requires its API token: set ARRCOC_ACCESS__API_TOKEN (or pass --token)."
                if not token
                else "ARRCOC_ACCESS__API_TOKEN does not match this deployment's token."
            )
    return token_owner(token) if token else None
