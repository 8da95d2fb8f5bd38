"""Who is calling and how often: the API token, the job owner, the client's address and the rate limits.

The limits are enforced at the HTTP door (`RateGate`, an ASGI middleware), before Gradio queues a
call and before any input is checked: every call is counted, a malformed one too, and a refused
call costs one dictionary look-up, never a place in the queue. docs/security.md says what this
protects and what it does not.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from functools import lru_cache
from typing import Any

from arrcoc.errors import AccessDenied
from arrcoc.service.access import RateLimiter, anonymous_owner, check_token, token_owner
from arrcoc.settings import get_settings

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
# Which limit each endpoint counts against (by api_name); every other call (the page's own
# follow-up events: drawing views, polls) counts against "status".
LIMIT_KIND = {
    "run": "infer",
    "infer": "infer",
    "run_without_query": "infer",
    "batch_submit": "jobs",
    "bench_submit": "jobs",
    "page_batch_submit": "jobs",
    "page_bench_submit": "jobs",
}
WHAT = {"infer": "requests", "jobs": "job submissions", "status": "status requests"}
MAX_BODY = 1 << 20  # a call's JSON (files travel by /upload): larger bodies are not parsed for the endpoint
MAX_CALL_BODY = 16 << 20  # a call's body beyond this is refused unread (413)


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
    (ARRCOC_TRUSTED_PROXIES): then the rightmost hop that is not a proxy of ours is the client (the
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
    return address_of(peer, _header(request, "x-forwarded-for"), get_settings().trusted_proxies)


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
    return {"infer": s.rate_limit_infer_per_min, "jobs": s.rate_limit_jobs_per_min}.get(
        kind, s.rate_limit_status_per_min
    )


def limiter(kind: str) -> RateLimiter:
    per_min = _per_minute(kind)
    with _limits_lock:
        lim = _limits.get(kind)
        if lim is None or lim.per_minute != per_min:
            lim = _limits[kind] = RateLimiter(per_min)
        return lim


def reset_limits() -> None:
    """Forget every client's count (tests; a restart does the same)."""
    with _limits_lock:
        _limits.clear()


REFUSALS = RefusalLog()  # rate-limit refusals: a few lines per client a minute


def limit_key(token: str, address: str) -> str:
    """Token holders are counted by their token, everyone else by address."""
    expected = get_settings().api_token
    return token_owner(token) if token and expected and token == expected else address


def check_rate(kind: str, key: str) -> None:
    """AccessDenied when `key` is over this kind's limit (the call is counted either way)."""
    limiter(kind).check(key, WHAT.get(kind, "requests"))


# ---- the door: counted before Gradio queues or checks anything --------------------------------------------


class RateGate:
    """ASGI middleware: every call of an endpoint (POST to the queue or the REST routes) is counted
    against its client's limit before Gradio sees it; over the limit it is answered 429 with the
    reason, which the page shows as an error and gradio_client raises."""

    CALL_PATHS = ("/gradio_api/queue/join", "/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/")

    def __init__(self, app: Any, blocks: Any = None):
        self.app, self.blocks = app, blocks

    def _kind(self, path: str, body: bytes) -> str:
        name = ""
        if path.endswith("/queue/join"):
            try:
                index = json.loads(body).get("fn_index") if len(body) <= MAX_BODY else None
                fns = getattr(self.blocks, "fns", {}) or {}
                fn = fns.get(index) if isinstance(fns, dict) else None
                name = str(getattr(fn, "api_name", "") or "")
            except (ValueError, AttributeError, TypeError):
                name = ""
        else:  # /gradio_api/{call,run,api}/[v2/]{api_name}[/...]
            parts = [p for p in path.split("/")[3:] if p]
            name = parts[1] if parts[:1] == ["v2"] and len(parts) > 1 else (parts[0] if parts else "")
        return LIMIT_KIND.get(name, "status")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or not path.startswith(self.CALL_PATHS)
        ):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:  # the body is read once here and replayed to Gradio
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
            if sum(map(len, chunks)) > MAX_CALL_BODY:
                await _json(send, 413, {"detail": "The request is too large."})
                return
        body = b"".join(chunks)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        peer = (scope.get("client") or ("", 0))[0] or ""
        address = address_of(peer, headers.get("x-forwarded-for", ""), get_settings().trusted_proxies)
        bearer = headers.get("authorization", "")
        token = headers.get("x-arrcoc-token", "").strip() or (
            bearer[7:].strip() if bearer[:7].lower() == "bearer " else ""
        )
        kind = self._kind(path, body)
        try:
            check_rate(kind, limit_key(token, address))
        except AccessDenied as e:
            REFUSALS.refused(address, f"rate limit ({kind}) for {address}: {e}")
            await _json(send, 429, {"detail": str(e), "error": str(e)})
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _json(send: Any, status: int, doc: dict) -> None:
    data = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
