"""Who is calling and how often: the API token, the job owner, the client's address and the rate limits.

The limits are enforced at the HTTP door (demo/gate.py's `RateGate`, an ASGI middleware), before
Gradio queues a call and before any input is checked. docs/security.md says what this protects
and what it does not.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from functools import lru_cache
from typing import Any

from arrcoc.service.access import RateLimiter, anonymous_owner, check_token, token_owner
from arrcoc.settings import get_settings

from .errors import REFUSALS as INPUT_REFUSALS
from .errors import RefusalLog
from .inputs import text_field

log = logging.getLogger("arrcoc.demo")

CLIENT_COOKIE = "arrcoc_client"
# sets a random id for this browser once (a cookie, so it survives a refresh): its jobs are bound to it
SET_CLIENT_COOKIE_JS = (
    "() => { if (!document.cookie.split('; ').some(c => c.startsWith('" + CLIENT_COOKIE + "='))) {"
    " const a = new Uint8Array(16); crypto.getRandomValues(a);"
    " const id = Array.from(a, b => b.toString(16).padStart(2, '0')).join('');"
    " document.cookie = '" + CLIENT_COOKIE + "=' + id + '; path=/; max-age=31536000; SameSite=Lax'; } }"
)
WHAT = {"infer": "requests", "jobs": "job submissions", "status": "status requests", "upload": "uploads"}


# ---- the client -------------------------------------------------------------------------------------


def _header(request: Any, name: str) -> str:
    headers = getattr(request, "headers", None) or {}
    try:
        return str(headers.get(name) or "")
    except Exception:  # noqa: BLE001 -- an odd request object: no header
        return ""


def request_token(request: Any, typed: object = None) -> str:
    """The API token of a request: the token field, else the X-Arrcoc-Token or Bearer header."""
    text = text_field(typed, "The API token").strip()
    if text:
        return text
    bearer = _header(request, "authorization")
    return _header(request, "x-arrcoc-token").strip() or (
        bearer[7:].strip() if bearer[:7].lower() == "bearer " else ""
    )


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _trusted(address: str, proxies: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in _networks(proxies))


def uvicorn_proxies(proxies: tuple[str, ...]) -> str:
    """The trusted proxies as uvicorn's FORWARDED_ALLOW_IPS (networks in their canonical form)."""
    return ",".join(str(net) for net in _networks(proxies))


def address_of(peer: str, forwarded_for: str, proxies: tuple[str, ...]) -> str:
    """The client's address. `X-Forwarded-For` counts only when the peer is one of our proxies
    (ARRCOC_ACCESS__TRUSTED_PROXIES): then the rightmost hop that is not a proxy of ours is the client (the
    hops left of it are whatever the client wrote). Anyone else's header is ignored."""
    if not peer or not _trusted(peer, proxies):
        return peer or "unknown"
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            return hop
    return hops[0] if hops else peer


def client_address(request: Any) -> str:
    client = getattr(request, "client", None)
    peer = str(getattr(client, "host", "") or "")
    return address_of(peer, _header(request, "x-forwarded-for"), get_settings().access.trusted_proxies)


def owner_of(request: Any, typed_token: object = None, kind: str = "batch") -> str:
    """Who makes or asks about a job: the token holder, else this browser, else this session.
    AccessDenied when this kind of job needs the token and the request lacks it."""
    owner = check_token(get_settings(), kind, request_token(request, typed_token))
    if owner:
        return owner
    cookies = getattr(request, "cookies", None) or {}
    return anonymous_owner(cookies.get(CLIENT_COOKIE), getattr(request, "session_hash", None))


# ---- rate limits ---------------------------------------------------------------------------------------

_limits: dict[str, RateLimiter] = {}
_limits_lock = threading.Lock()


def _per_minute(kind: str) -> int:
    s = get_settings()
    if kind == "upload":  # a photo a request, a zip and a manifest a job: more is not a client's use
        infer, jobs = s.limits.infer_per_min, s.limits.jobs_per_min
        return 0 if infer <= 0 or jobs <= 0 else infer + 2 * jobs
    return {"infer": s.limits.infer_per_min, "jobs": s.limits.jobs_per_min}.get(kind, s.limits.status_per_min)


def limiter(kind: str) -> RateLimiter:
    per_min = _per_minute(kind)
    with _limits_lock:
        lim = _limits.get(kind)
        if lim is None or lim.per_minute != per_min:
            lim = _limits[kind] = RateLimiter(per_min)
        return lim


def reset_limits() -> None:
    """Forget every client's count and logged refusals (tests; a restart does the same)."""
    with _limits_lock:
        _limits.clear()
    REFUSALS.reset()
    INPUT_REFUSALS.reset()


REFUSALS = RefusalLog()  # rate-limit refusals: a few lines per client a minute


def limit_key(token: str, address: str) -> str:
    """Token holders are counted by their token, everyone else by address."""
    expected = get_settings().access.api_token
    return token_owner(token) if token and expected and token == expected else address


def check_rate(kind: str, key: str) -> None:
    """AccessDenied when `key` is over this kind's limit (the call is counted either way)."""
    limiter(kind).check(key, WHAT.get(kind, "requests"))
