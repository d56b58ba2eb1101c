"""Who may talk to the server, checked before any route: the ``Host`` header (DNS rebinding), the ``Origin``
header (cross-origin pages) and CORS for the origins the user lists.

A request is served only when its ``Host`` names this server: ``localhost``, ``127.0.0.1``, ``[::1]``, the
address or name it was bound to, the local address the connection came in on (so ``--host 0.0.0.0`` serves
``http://192.168.1.5:8080`` on that interface), or a name given with ``allowed_hosts`` (a reverse proxy's), with
any port; anything else, or no ``Host`` at all, is a 421. A request carrying an ``Origin`` (browsers send one on
cross-origin requests) is a 403 unless the origin is listed; a listed origin gets CORS headers and its preflight
``OPTIONS`` is answered (204, without the API key, which browsers do not send on preflights).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse, Response

from .errors import ApiError, dialect_of, error_body

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the names every server answers to
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_NAME = re.compile(r"[a-z0-9_.-]+\Z")
_ORIGIN = re.compile(r"(https?)://([a-z0-9_.-]+|\[[0-9a-f:.]+\])(:\d{1,5})?\Z")
_TOKENS = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*\Z")
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), lower-cased, an IP
    address in its normal form; None when the header is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return normal_host(name)


def normal_host(name: str) -> str | None:
    """``name`` lower-cased (an IP address in its normal form, IPv6 without brackets); None when it is no host."""
    name = name.strip().lower().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    return name if name and _NAME.match(name) and ":" not in name else None


def normal_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` lower-cased, without a trailing slash; None when it is not such an origin."""
    origin = origin.strip().lower().removesuffix("/")
    return origin if _ORIGIN.match(origin) else None


class Policy:
    """The Host/Origin/CORS rules (see the module's docstring) around the ASGI ``app``; ``count`` is told the
    status of every refusal (for /metrics)."""

    def __init__(self, app: ASGIApp, bound: str, allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = (), count: Callable[[int], None] | None = None) -> None:
        self.app = app
        names = {normal_host(h) for h in (bound, *allowed_hosts)}
        bad = [h for h in allowed_hosts if normal_host(h) is None]
        if bad:
            raise ValueError(f"not a host name: {bad[0]!r}")
        self.hosts = LOOPBACK_NAMES | {n for n in names if n is not None} - {"0.0.0.0", "::"}
        origins = [normal_origin(o) for o in cors_origins]
        if None in origins:
            raise ValueError(f"not an origin (scheme://host[:port]): {cors_origins[origins.index(None)]!r}")
        self.origins = frozenset(o for o in origins if o is not None)
        self.count = count or (lambda _status: None)

    def host_ok(self, host: str | None, server: tuple[str, int | None] | None) -> bool:
        name = host_name(host) if host is not None else None
        if name is None:
            return False
        if name in self.hosts:
            return True
        if server is None:
            return False
        try:
            local = ipaddress.ip_address(server[0].split("%")[0])
        except ValueError:
            return False
        mapped = getattr(local, "ipv4_mapped", None)
        return name in (str(local), str(mapped))

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, exc: ApiError) -> None:
        """Answer ``exc`` in the shape of the API the path speaks (a refused Ollama or Anthropic client reads its
        own error), and close the connection."""
        self.count(exc.status)
        body = error_body(exc, dialect_of(str(scope.get("path", ""))))
        await JSONResponse(body, status_code=exc.status, headers={"Connection": "close"})(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            if k in headers:  # a repeated Host or Origin: ambiguous, refused below
                headers[k] = b"\0"
            else:
                headers[k] = v
        host = headers.get(b"host")
        if not self.host_ok(host.decode("latin-1") if host is not None else None, scope.get("server")):
            await self._refuse(scope, receive, send, ApiError(
                421, "this server does not answer to that Host header (send the address it listens on, or start "
                "it with --allowed-host NAME)", code="host_not_allowed"))
            return
        raw_origin = headers.get(b"origin")
        if raw_origin is None:
            await self.app(scope, receive, send)
            return
        origin = normal_origin(raw_origin.decode("latin-1"))
        if origin is None or origin not in self.origins:
            await self._refuse(scope, receive, send, ApiError(
                403, "cross-origin requests are refused (start the server with --cors-origin ORIGIN to allow a web "
                "page's origin)", code="origin_not_allowed"))
            return
        cors = [(b"access-control-allow-origin", raw_origin), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            asked = headers.get(b"access-control-request-headers", b"").decode("latin-1").strip()
            allow = CORS_HEADERS + (", " + asked if asked and _TOKENS.match(asked) else "")
            await Response(status_code=204, headers={
                "Access-Control-Allow-Origin": raw_origin.decode("latin-1"), "Vary": "Origin",
                "Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Allow-Headers": allow,
                "Access-Control-Max-Age": "600"})(scope, receive, send)
            return

        async def send_cors(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *cors]
            await send(message)

        await self.app(scope, receive, send_cors)
