"""quantscope serve against a hostile client: foreign Host headers (DNS rebinding), cross-origin posts, CORS,
half-sent requests, a full file table, signals with open streams, and the command's one-line errors. Real HTTP on
127.0.0.1 (raw sockets for the header tricks); no sleeps as synchronisation, no wall-clock asserts."""

from __future__ import annotations

import http.client as httplib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantscope.cli.main import main
from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server

from .server_helpers import serving

ORIGIN = "http://app.example:3000"  # the one origin the fixture allows cross-origin requests from
PROXY = "proxy.example"  # the one extra Host name it accepts
TIMEOUT = 2.0  # the fixture's request read timeout: half-sent requests are closed after it
WAIT = 120  # generous socket timeout for every read: a wait for the server's event, never a measure
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    path = model_path("smollm2")
    with serving(path, parallel=1, max_queue=4, allowed_hosts=(PROXY,), cors_origins=(ORIGIN,), timeout=TIMEOUT,
                 max_connections=16) as srv:
        yield srv


class Reply:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0] else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        """The OpenAI-shaped error of a refusal."""
        err = self.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
        return err


def exchange(port: int, data: bytes) -> Reply:
    """Send ``data`` (one request with ``Connection: close``) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(data)
        buf = bytearray()
        while chunk := s.recv(65536):
            buf += chunk
    return Reply(bytes(buf))


def request(server: Server, method: str, path: str, *, host: str | None = "127.0.0.1:{port}", body: Any = None,
            content_type: str | None = "application/json", headers: dict[str, str] | None = None,
            version: str = "1.1") -> Reply:
    """One raw request; ``host``: the Host header ({port}: the server's), None: none at all."""
    lines = [f"{method} {path} HTTP/{version}"]
    if host is not None:
        lines.append(f"Host: {host.format(port=server.port)}")
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    if body is not None:
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(data)}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append("Connection: close")
    return exchange(server.port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)


def closed_by_server(s: socket.socket) -> bool:
    """Read until the server closes ``s``: b'' (or a reset, when it closed before reading what was sent)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def idle(server: Server) -> None:
    end = time.monotonic() + WAIT
    while server.scheduler.busy_slots or server.scheduler.queued:
        assert time.monotonic() < end, "the slot did not become free"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------- Host (rebinding)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "localhost.evil.example",
                                  "127.0.0.1.evil.example:{port}", "127.0.0.1:{port}@evil.example", "[::1",
                                  "127.0.0.1:port", "::1", ""])
def test_a_foreign_host_is_refused_on_every_path(server: Server, host: str) -> None:
    """A page whose name was rebound to 127.0.0.1 sends its own name as Host: every path refuses it (/health too)
    with an OpenAI-shaped error, and the engine is never touched."""
    host = host.format(port=server.port)
    before = server.scheduler.metrics.requests
    for method, path, body in [("GET", "/health", None), ("GET", "/v1/models", None), ("GET", "/metrics", None),
                               ("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}),
                               ("POST", "/tokenize", {"content": "hi"}), ("GET", "/nothing", None)]:
        r = request(server, method, path, host=host, body=body)
        assert r.status == 421, (host, path, r.status, r.body)
        assert r.error()["code"] == "host_not_allowed"
        assert "location" not in r.headers
    assert server.scheduler.metrics.requests == before


def test_no_host_header_is_refused(server: Server) -> None:
    r = request(server, "GET", "/health", host=None, version="1.0")
    assert r.status == 421 and r.error()["code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LocalHost", "[::1]:{port}",
                                  "[::1]", "[0:0:0:0:0:0:0:1]:{port}", PROXY, f"{PROXY.upper()}:443"])
def test_the_bound_address_loopback_names_and_allowed_hosts_are_served(server: Server, host: str) -> None:
    r = request(server, "GET", "/health", host=host.format(port=server.port))
    assert r.status == 200 and r.json()["status"] == "ok"


def test_on_all_addresses_the_address_a_request_came_in_on_is_its_host() -> None:
    """--host 0.0.0.0 / :: : the local address of the connection (an IP literal cannot be rebound) is accepted, no
    other address, and never 0.0.0.0 itself; names need --allowed-host."""
    from quantscope.core.server.policy import Policy

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    p = Policy(app, "0.0.0.0")
    here = ("192.0.2.2", 8080)
    assert p.host_ok("192.0.2.2:8080", here) and p.host_ok("192.0.2.2", here) and p.host_ok("localhost", here)
    assert not p.host_ok("192.0.2.3:8080", here) and not p.host_ok("0.0.0.0:8080", here)
    assert not p.host_ok("myhost.lan", here) and not p.host_ok("evil.example", here)
    assert Policy(app, "::", allowed_hosts=("myhost.lan",)).host_ok("MyHost.lan:8080", here)
    assert p.host_ok("[fd00::2]:8080", ("fd00::2", 8080)) and not p.host_ok("[fd00::3]", ("fd00::2", 8080))
    assert p.host_ok("192.0.2.2:8080", ("::ffff:192.0.2.2", 8080))  # a dual-stack socket's IPv4 client
    assert not p.host_ok("192.0.2.2", None)


def test_a_trailing_slash_is_never_a_redirect(server: Server) -> None:
    """Starlette redirected /v1/models/ to the sent Host: now it is a plain 404 (and a foreign Host a 421)."""
    for host, status in [("127.0.0.1:{port}", 404), ("evil.example", 421)]:
        r = request(server, "GET", "/v1/models/", host=host)
        assert r.status == status and "location" not in r.headers, r.headers
        assert "error" in r.json()


# ------------------------------------------------------------------------------------ Content-Type and Origin
def test_a_post_must_be_json(server: Server) -> None:
    """A form or text/plain post is what a page can send cross-origin without a preflight: refused (415) before
    anything runs; application/json with parameters is fine."""
    idle(server)
    before = server.scheduler.metrics.requests
    body = {"messages": CHAT, "max_tokens": 1}
    for ctype in ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/jsonp", "application/json-patch+json", None]:
        r = request(server, "POST", "/v1/chat/completions", body=body, content_type=ctype)
        assert r.status == 415, (ctype, r.status, r.body)
        assert r.error()["code"] == "unsupported_media_type"
        r = request(server, "POST", "/tokenize", body={"content": "hi"}, content_type=ctype)
        assert r.status == 415, (ctype, r.status)
    assert server.scheduler.metrics.requests == before
    for ctype in ["application/json", "Application/JSON; charset=UTF-8", "application/json;charset=utf-8"]:
        assert request(server, "POST", "/tokenize", body={"content": "hi"}, content_type=ctype).status == 200
    r = request(server, "POST", "/v1/chat/completions", body=body)
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("origin", ["http://evil.example", "null", f"{ORIGIN}.evil.example", "http://app.example",
                                    "https://app.example:3000", "http://127.0.0.1:1"])
def test_a_foreign_origin_is_refused(server: Server, origin: str) -> None:
    """Any request a browser marks with an Origin not listed with --cors-origin: 403 on every path."""
    before = server.scheduler.metrics.requests
    for method, path, body in [("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}),
                               ("GET", "/v1/models", None), ("GET", "/health", None)]:
        r = request(server, method, path, body=body, headers={"Origin": origin})
        assert r.status == 403, (origin, path, r.status)
        assert r.error()["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
    r = request(server, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert r.status == 403 and "access-control-allow-origin" not in r.headers
    assert server.scheduler.metrics.requests == before


def test_cors_answers_only_the_listed_origin(server: Server) -> None:
    r = request(server, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status == 204, r.body
    assert r.headers["access-control-allow-origin"] == ORIGIN and "origin" in r.headers["vary"].lower()
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    r = request(server, "POST", "/tokenize", body={"content": "hi"}, headers={"Origin": ORIGIN})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = request(server, "POST", "/tokenize", body={"content": "hi"})
    assert r.status == 200 and "access-control-allow-origin" not in r.headers
    # a foreign Host is refused before CORS is considered
    r = request(server, "OPTIONS", "/v1/chat/completions", host="evil.example",
                headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status == 421 and "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------------------- half-sent requests and limits
def test_half_sent_requests_are_closed_after_the_timeout(server: Server) -> None:
    """Silent, half a request line, headers without their end, a body short of its Content-Length, a second
    request half sent on a kept-alive connection: each is closed by the server (recv() gives b'') once the read
    timeout passes; /health answers meanwhile and after."""
    port = server.port
    socks = []
    try:
        for data in [b"", b"GET /heal", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                     b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"content\": "]:
            s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
            s.sendall(data)
            socks.append(s)
        keep = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b'"status"' not in got:
            part = keep.recv(65536)
            assert part, "the first request on the kept-alive connection was not answered"
            got += part
        keep.sendall(b"GET /health HTTP/1.1\r\nHo")
        socks.append(keep)
        assert request(server, "GET", "/health").status == 200
        for s in socks:
            assert closed_by_server(s)
    finally:
        for s in socks:
            s.close()
    assert request(server, "GET", "/health").status == 200


def test_a_connection_cap_evicts_the_oldest_half_sent_request(server: Server) -> None:
    """Beyond the cap (16 in the fixture) the connection waiting longest for its request is closed at once, not
    after the timeout: 40 half-sent requests leave the first ones closed and /health answering."""
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        assert request(server, "GET", "/health").status == 200
        assert closed_by_server(socks[0])
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------------------------- the command
EXE = os.path.join(os.path.dirname(sys.executable), "quantscope")


def serve(model: Path, *args: str, nofile: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """``quantscope serve`` on a free port; returns the process and its URL (from the line on stderr)."""
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen([EXE, "serve", str(model), "--port", "0", "--backend", "cpu", "-t", "1", *args],
                            stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    assert proc.stderr is not None
    for _ in range(50):
        line = proc.stderr.readline()
        m = re.search(r" at (http://\S+?)/v1", line)
        if m:
            return proc, m.group(1)
        if not line:
            break
    proc.kill()
    raise AssertionError(f"the server did not say where it listens: {proc.communicate()[1]}")


def finish(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    _out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, err


def test_a_full_file_table_of_half_sent_requests_leaves_health_answering(model_path: Any) -> None:
    """The open-file limit at 128 and 120 half-sent requests: the cap (from the limit) closes the oldest ones so
    /health still answers, long before the (long) read timeout would."""
    proc, url = serve(model_path("smollm2"), "-c", "128", "--timeout", "600", nofile=128)
    port = int(url.rsplit(":", 1)[1])
    socks = []
    try:
        for _ in range(120):
            s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            buf = b""
            while part := s.recv(65536):
                buf += part
        assert Reply(buf).status == 200 and Reply(buf).json()["status"] == "ok"
        assert closed_by_server(socks[0])  # the oldest was closed to make room
    finally:
        for s in socks:
            s.close()
        rc, err = finish(proc)
    assert rc == 0 and "Traceback" not in err, err


def sse(conn: httplib.HTTPConnection, body: dict[str, Any]) -> httplib.HTTPResponse:
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    return r


def rest_of_stream(r: httplib.HTTPResponse) -> list[str]:
    """The remaining ``data:`` lines; ``read()`` after them raises IncompleteRead if the chunked body never ends."""
    lines = []
    while line := r.readline():
        if line.startswith(b"data: "):
            lines.append(line[6:].decode().strip())
    assert r.read() == b""
    return lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_streams_and_queued_requests_cleanly(model_path: Any, sig: int) -> None:
    """A running stream, a queued stream, a queued whole reply and a half-sent body when the signal comes: both
    streams end with an error event, ``data: [DONE]`` and the end of the chunked body; the whole reply is a 503;
    the half-sent one is closed (not waited for until its long read timeout); the command exits 0 with one line,
    no traceback. (--host 127.1 is loopback: no warning about it.)"""
    proc, url = serve(model_path("smollm2"), "-c", "2048", "--max-queue", "4", "--host", "127.1", "--timeout", "600")
    port = int(url.rsplit(":", 1)[1])
    long = {"messages": CHAT, "max_tokens": 1900, "ignore_eos": True, "stream": True, "temperature": 0}
    conns = [httplib.HTTPConnection("127.0.0.1", port, timeout=WAIT) for _ in range(4)]
    half = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    try:
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        running = sse(conns[0], long)
        while not running.readline().startswith(b'data: {"id"'):  # the role, then the first token: it runs
            pass
        assert running.readline().strip() == b""
        while not running.readline().startswith(b'data: {"id"'):
            pass
        queued = sse(conns[1], long)
        assert queued.readline().startswith(b"data: ")  # the role chunk comes before a slot
        conns[2].request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 4}).encode(),
                         headers={"Content-Type": "application/json"})
        end = time.monotonic() + WAIT
        while True:  # the whole reply is in the queue too
            conns[3].request("GET", "/health")
            if json.loads(conns[3].getresponse().read())["queued"] == 2:
                break
            assert time.monotonic() < end
        proc.send_signal(sig)
        for r in (running, queued):
            lines = rest_of_stream(r)
            assert lines[-1] == "[DONE]", lines[-3:]
            err = json.loads(lines[-2])["error"]
            assert "shutting down" in err["message"] and err["code"] == "server_shutting_down"
        whole = conns[2].getresponse()
        assert whole.status == 503
        assert json.loads(whole.read())["error"]["code"] == "server_shutting_down"
        assert closed_by_server(half)
    finally:
        half.close()
        for c in conns:
            c.close()
        rc, err = finish(proc, sig)
    assert rc == 0, err
    assert "Traceback" not in err and "warning" not in err, err
    assert err.strip().splitlines()[-1] == "quantscope: server stopped", err


def test_an_abandoned_queued_request_counts_as_finished(server: Server) -> None:
    """A client that gives up while its request waits for the slot: /metrics counts it finished (cancelled)."""
    idle(server)
    m = server.scheduler.metrics
    requests, finished = m.requests, sum(m.finished.values())
    runner = httplib.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    sse(runner, {"messages": CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True})
    end = time.monotonic() + WAIT
    while not server.scheduler.busy_slots:  # the runner has the slot
        assert time.monotonic() < end
        time.sleep(0.01)
    waiter = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    waiter.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    while not (server.scheduler.queued and m.requests == requests + 2):  # the waiter waits for it
        assert time.monotonic() < end
        time.sleep(0.01)
    waiter.close()
    while server.scheduler.queued:
        assert time.monotonic() < end
        time.sleep(0.01)
    runner.close()
    idle(server)
    text = request(server, "GET", "/metrics").body.decode()
    total = sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("quantscope_requests_finished"))
    assert m.requests == requests + 2
    assert total == sum(m.finished.values()) == finished + 2


# ---------------------------------------------------------------------------------------- one-line errors
def run(capsys: Any, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port in use: a command that got past its checks fails on it instead of serving."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.mark.parametrize(("args", "message"), [
    (["--api-key", "clé"], "the API key must be printable ASCII"),
    (["--api-key", "k\x7f"], "the API key must be printable ASCII"),
    (["--host", ""], "--host: "),
    (["--allowed-host", ""], "--allowed-host: "),
    (["--allowed-host", "a b"], "--allowed-host: "),
    (["--cors-origin", "app.example"], "--cors-origin: "),
    (["--cors-origin", "*"], "--cors-origin: "),
    (["--timeout", "0"], "argument --timeout: "),
])
def test_serve_refuses_bad_options_before_loading(capsys: Any, model_path: Any, taken_port: int, args: list[str],
                                                  message: str) -> None:
    rc, err = run(capsys, "serve", str(model_path("smollm2")), "--port", str(taken_port), *args)
    assert rc == 2 and err.startswith("quantscope: error: ") and message in err and err.count("\n") == 1, err


def test_serve_non_ascii_key_file(capsys: Any, model_path: Any, taken_port: int, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("schlüssel\n", encoding="utf-8")
    rc, err = run(capsys, "serve", str(model_path("smollm2")), "--port", str(taken_port), "--api-key-file", str(key))
    assert rc == 2 and "the API key must be printable ASCII" in err and err.count("\n") == 1, err


def test_a_taken_port_is_reported_before_the_model_loads(capsys: Any, model_path: Any, taken_port: int) -> None:
    rc, err = run(capsys, "serve", str(model_path("smollm2")), "--port", str(taken_port))
    assert rc == 2 and err == f"quantscope: error: cannot listen on 127.0.0.1:{taken_port}: Address already in use\n"


def test_gpu_layers_without_a_gpu_keep_the_reason(model_path: Any) -> None:
    from quantscope.core.engine.cuda_backend import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("a GPU is usable here: nothing to fall back from")
    eng = Engine(model_path("smollm2"), n_ctx=64, threads=1, gpu_layers=5, repack=False)
    try:
        assert eng.backend == "cpu" and why in eng.backend_reason, eng.backend_reason
    finally:
        eng.close()


def test_a_file_as_cost_cache_is_one_line(capsys: Any, model_path: Any, tmp_path: Path) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    rc, err = run(capsys, "sensitivity", str(model_path("smollm2")), "-f", str(text), "--types", "Q8_0",
                  "--allow-requantize", "--ctx", "16", "--cost-cache", str(cache))
    assert rc == 2 and err.startswith("quantscope: error: --cost-cache: ") and err.count("\n") == 1, err
    assert "internal error" not in err


def test_imatrix_on_an_empty_text_blames_the_text(capsys: Any, model_path: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    model = str(model_path("smollm2"))
    rc, err = run(capsys, "imatrix", model, "-f", str(empty), "-o", str(tmp_path / "m.gguf"))
    assert rc == 2 and err == f"quantscope: error: -f: {empty} is empty\n"
    short = tmp_path / "short.txt"
    short.write_text("hello")
    rc, err = run(capsys, "imatrix", model, "-f", str(short), "-o", str(tmp_path / "m.gguf"))
    assert rc == 2 and err.startswith(f"quantscope: error: -f {short}: the text has ") and model not in err, err
