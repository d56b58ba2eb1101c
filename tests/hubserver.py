"""A Hugging Face hub that runs here: a real HTTP server on 127.0.0.1 (two ports: the hub and the "CDN" its LFS
redirects point to, a different origin as on huggingface.co, so the client drops the token and does not follow the
redirect on its metadata request) with the routes the real ``huggingface_hub`` client (2.x) uses:

* ``GET /api/models`` (``search``, ``filter=gguf``, ``sort`` downloads/likes/lastModified, ``limit``, ``expand``)
* ``GET /api/models/ORG/REPO[/revision/REV]`` (model info; ``siblings`` with sizes, ``blobId`` and ``lfs`` records)
* ``GET /api/models/ORG/REPO/tree/REV[/PATH]`` (``recursive``; files with ``oid``, ``size``, ``lfs``)
* ``HEAD``/``GET /ORG/REPO/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag``; a GGUF (LFS) file answers 302 to the CDN
  with ``X-Linked-Etag`` (its SHA-256) and ``X-Linked-Size``; errors with the hub's ``X-Error-Code`` header
  (``RepoNotFound``, ``EntryNotFound``, ``GatedRepo`` with 401 without a token, 403 with one not granted)
* the CDN: ``HEAD``/``GET`` with ``Range`` (206 and ``Content-Range``)
* publishing (a token in :attr:`HubServer.tokens` needed): ``POST /api/repos/create`` (409 when it exists),
  ``POST /api/models/ORG/REPO/preupload/REV`` (GGUFs are LFS), the LFS batch API ``POST /ORG/REPO.git/info/lfs/
  objects/batch`` (basic transfer: a ``PUT`` to the CDN, checked against the SHA-256) and ``POST /api/models/ORG/
  REPO/commit/REV`` (NDJSON: ``header``, ``file`` base64, ``lfsFile`` by oid), ``POST /api/validate-yaml`` (a
  card's front matter parsed with PyYAML); the client must not use Xet
  (``HF_HUB_DISABLE_XET=1`` in :meth:`HubServer.env`, since ``hf_xet`` is installed)

No ``X-Xet-*`` header is ever sent, so the client downloads over plain HTTP. Knobs for tests: cut the connection
after N bytes once (``cut_after``), serve a file with one byte flipped (``corrupt``), pause every chunk
(``slow``), stall after N bytes until released (``hold_after``), and count the bytes served per file (``served``)
and the requests (``log``). Point the client at it with :meth:`HubServer.env` (``HF_ENDPOINT``, ``HF_HOME``)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 64 << 10


@dataclass
class Repo:
    id: str
    files: dict[str, bytes]
    gated: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-01-01T00:00:00.000Z"
    granted: set[str] = field(default_factory=set)  # tokens with access to a gated repo

    @property
    def commit(self) -> str:
        return hashlib.sha1(self.id.encode()).hexdigest()

    @staticmethod
    def lfs(path: str) -> bool:
        return path.endswith(".gguf")

    def entry(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        if self.lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
            return {"oid": _git_oid(pointer), "size": len(data),
                    "lfs": {"oid": sha, "size": len(data), "pointerSize": len(pointer)}}
        return {"oid": _git_oid(data), "size": len(data)}


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.tokens = {"hf_testtoken"}
        self.cut_after: dict[str, int] = {}  # "org/repo/path" -> bytes, once
        self.corrupt: set[str] = set()
        self.slow = 0.0
        self.hold_after: dict[str, int] = {}
        self.release = threading.Event()
        self.served: Counter[str] = Counter()
        self.log: list[tuple[str, str, str | None]] = []
        self.uploads: dict[str, bytes] = {}  # LFS objects PUT to the CDN, by SHA-256
        self.commits: list[dict[str, Any]] = []
        self.cards: list[Any] = []  # the front matter of each model card validated
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []

    # -------------------------------------------------------------------------------- setup
    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], **kw: Any) -> Repo:
        r = Repo(repo_id, {p: (v.read_bytes() if isinstance(v, Path) else v) for p, v in files.items()}, **kw)
        self.repos[repo_id] = r
        return r

    def start(self) -> HubServer:
        for role in ("hub", "cdn"):
            srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, role))
            srv.daemon_threads = True
            srv.handle_error = _quiet_disconnect(srv.handle_error)  # type: ignore[method-assign]
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self._servers.append(srv)
        return self

    def stop(self) -> None:
        self.release.set()
        for s in self._servers:
            s.shutdown()
            s.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def env(self, home: Path, base: dict[str, str] | None = None, token: str | None = None) -> dict[str, str]:
        """An environment for a client subprocess: this hub, ``home`` as HF_HOME, no telemetry, no other token."""
        import os

        env = {k: v for k, v in (base if base is not None else os.environ).items()
               if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_IMPLICIT_TOKEN="1" if token is None else "0", HF_HUB_ETAG_TIMEOUT="30",
                   HF_HUB_DOWNLOAD_TIMEOUT="30")
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    def bytes_served(self, repo: str, path: str) -> int:
        with self._lock:
            return self.served[f"{repo}/{path}"]


def _quiet_disconnect(handle_error: Any) -> Any:
    """A client that hangs up mid-request (a cancelled upload) is no server error: not printed."""
    import sys

    def handle(request: Any, address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            handle_error(request, address)
    return handle


def _handler(hub: HubServer, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        # ---------------------------------------------------------------- plumbing
        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj: Any, headers: dict[str, str] | None = None) -> None:
            self._send(200, json.dumps(obj).encode(), headers)

        def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})})

        def _token(self) -> str | None:
            auth = self.headers.get("Authorization") or ""
            return auth[7:] if auth.startswith("Bearer ") else None

        def do_HEAD(self) -> None:
            self._route()

        def do_GET(self) -> None:
            self._route()

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if n == 0:
                        self.rfile.readline()
                        return bytes(out)
                    out += self.rfile.read(n)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_POST(self) -> None:
            self._write()

        def do_PUT(self) -> None:
            self._write()

        def _write(self) -> None:
            path = unquote(urlsplit(self.path).path)
            body = self._body()
            with hub._lock:
                hub.log.append((self.command, path, None))
            if role == "cdn":  # an LFS object's basic-transfer PUT
                oid = path.rsplit("/", 1)[-1]
                if hashlib.sha256(body).hexdigest() != oid:
                    return self._error(400, "BadRequest", "the object does not match its oid")
                with hub._lock:
                    hub.uploads[oid] = body
                return self._send(200, b"")
            if self._token() not in hub.tokens:
                return self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
            if path == "/api/repos/create":
                req = json.loads(body)
                repo_id = f"{req.get('organization') or 'me'}/{req['name']}"
                if repo_id in hub.repos:
                    msg = "You already created this model repo"
                    return self._send(409, json.dumps({"error": msg, "url": f"{hub.url}/{repo_id}"}).encode(),
                                      {"X-Error-Message": msg})
                hub.repos[repo_id] = Repo(repo_id, {})
                return self._json({"url": f"{hub.url}/{repo_id}", "name": repo_id})
            if path == "/api/validate-yaml":  # the card's front matter, as the hub checks it before a commit
                import yaml

                text = json.loads(body)["content"]
                try:
                    meta = yaml.safe_load(text.split("---")[1]) if text.startswith("---") else {}
                except yaml.YAMLError as exc:
                    return self._error(400, "BadRequest", f"Invalid YAML: {exc}")
                hub.cards.append(meta)
                return self._json({"errors": [], "warnings": []})
            parts = path.strip("/").split("/")
            if path.endswith(".git/info/lfs/objects/batch"):
                req = json.loads(body)
                objs = [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                         "actions": {"upload": {"href": f"{hub.cdn}/upload/{o['oid']}", "header": {}}}}
                        for o in req["objects"]]
                return self._json({"transfer": "basic", "objects": objs})
            if len(parts) >= 6 and parts[:2] == ["api", "models"]:
                r = hub.repos.get("/".join(parts[2:4]))
                if r is None:
                    return self._error(404, "RepoNotFound", "Repository not found")
                if parts[4] == "preupload":
                    files = [{"path": f["path"], "uploadMode": "lfs" if Repo.lfs(f["path"]) else "regular",
                              "shouldIgnore": False, "oid": None} for f in json.loads(body)["files"]]
                    return self._json({"files": files})
                if parts[4] == "commit":
                    return self._commit(r, body)
            self._error(404, "NotFound", f"no route {path}")

        def _commit(self, r: Repo, body: bytes) -> None:
            import base64

            lines = [json.loads(ln) for ln in body.splitlines() if ln.strip()]
            new: dict[str, bytes] = {}
            for ln in lines:
                v = ln["value"]
                if ln["key"] == "file":
                    new[v["path"]] = base64.b64decode(v["content"])
                elif ln["key"] == "lfsFile":
                    if v["oid"] not in hub.uploads:
                        return self._error(400, "BadRequest", f"LFS object {v['oid']} was not uploaded")
                    new[v["path"]] = hub.uploads[v["oid"]]
            r.files.update(new)
            sha = hashlib.sha1(json.dumps(sorted(r.files)).encode() + body).hexdigest()
            hub.commits.append({"repo": r.id, "summary": lines[0]["value"].get("summary"), "files": sorted(new)})
            self._json({"commitUrl": f"{hub.url}/{r.id}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None,
                        "success": True})

        def _route(self) -> None:
            u = urlsplit(self.path)
            path = unquote(u.path)
            q = parse_qs(u.query)
            with hub._lock:
                hub.log.append((self.command, path, self.headers.get("Range")))
            try:
                if role == "cdn":
                    return self._cdn(path)
                if path == "/api/models":
                    return self._list(q)
                if path.startswith("/api/models/"):
                    return self._api(path[len("/api/models/"):], q)
                parts = path.strip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
                self._error(404, "NotFound", f"no route {path}")
            except (BrokenPipeError, ConnectionResetError):
                pass

        # ---------------------------------------------------------------- API
        def _info(self, r: Repo, blobs: bool) -> dict[str, Any]:
            sib = []
            for p in sorted(r.files):
                e: dict[str, Any] = {"rfilename": p}
                if blobs:
                    ent = r.entry(p)
                    e.update(size=ent["size"], blobId=ent["oid"])
                    if "lfs" in ent:
                        e["lfs"] = {"sha256": ent["lfs"]["oid"], "size": ent["size"],
                                    "pointerSize": ent["lfs"]["pointerSize"]}
                sib.append(e)
            tags = ["gguf"] if any(p.endswith(".gguf") for p in r.files) else []
            return {"_id": r.commit[:24], "id": r.id, "modelId": r.id, "author": r.id.split("/")[0],
                    "sha": r.commit, "lastModified": r.last_modified, "private": False,
                    "gated": "manual" if r.gated else False, "disabled": False, "downloads": r.downloads,
                    "likes": r.likes, "tags": tags, "library_name": "gguf" if tags else None,
                    "siblings": sib}

        def _list(self, q: dict[str, list[str]]) -> None:
            rows = list(hub.repos.values())
            if "search" in q:
                rows = [r for r in rows if q["search"][0].lower() in r.id.lower()]
            for f in q.get("filter", []):
                rows = [r for r in rows if f in self._info(r, False)["tags"]]
            key = (q.get("sort") or ["downloads"])[0]
            field_of = {"downloads": "downloads", "likes": "likes", "lastModified": "last_modified"}
            if key in field_of:
                rows.sort(key=lambda r: getattr(r, field_of[key]), reverse=True)
            rows = rows[: int(q["limit"][0])] if "limit" in q else rows
            out = []
            for r in rows:
                info = self._info(r, False)
                del info["siblings"]
                out.append(info)
            self._json(out)

        def _api(self, rest: str, q: dict[str, list[str]]) -> None:
            parts = rest.split("/")
            repo_id = "/".join(parts[:2])
            r = hub.repos.get(repo_id)
            if r is None:
                return self._error(404, "RepoNotFound", f"Repository not found: {repo_id}")
            tail = parts[2:]
            if not tail or tail[0] == "revision":
                return self._json(self._info(r, "blobs" in q))
            if tail[0] == "tree":
                sub = "/".join(tail[2:])
                recursive = (q.get("recursive") or ["false"])[0].lower() == "true"
                out: list[dict[str, Any]] = []
                dirs: set[str] = set()
                for p in sorted(r.files):
                    if sub and not p.startswith(sub + "/"):
                        continue
                    rel = p[len(sub) + 1:] if sub else p
                    if "/" in rel and not recursive:
                        d = (sub + "/" if sub else "") + rel.split("/")[0]
                        if d not in dirs:
                            dirs.add(d)
                            out.append({"type": "directory", "oid": _git_oid(d.encode()), "size": 0, "path": d})
                        continue
                    out.append({"type": "file", "path": p, **r.entry(p)})
                return self._json(out)
            self._error(404, "NotFound", f"no route {rest}")

        # ---------------------------------------------------------------- files
        def _resolve(self, repo_id: str, rev: str, path: str) -> None:
            r = hub.repos.get(repo_id)
            if r is None:
                return self._error(404, "RepoNotFound", f"Repository not found: {repo_id}")
            commit = {"X-Repo-Commit": r.commit}
            if r.gated:
                tok = self._token()
                if tok is None or tok not in hub.tokens:
                    return self._error(401, "GatedRepo", f"Access to model {r.id} is restricted. You must have "
                                       "access to it and be authenticated to access it. Please log in.", commit)
                if tok not in r.granted:
                    return self._error(403, "GatedRepo", f"Access to model {r.id} is restricted and you are not "
                                       "in the authorized list.", commit)
            if rev not in ("main", r.commit):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if path not in r.files:
                return self._error(404, "EntryNotFound", f"{path} does not exist on {rev}", commit)
            ent = r.entry(path)
            if "lfs" in ent:
                sha = ent["lfs"]["oid"]
                loc = f"{hub.cdn}/{r.id}/{sha}/{quote(path)}"
                return self._send(302, b"", {**commit, "Location": loc, "ETag": f'"{ent["oid"]}"',
                                             "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(ent["size"])},
                                  ctype="text/plain")
            self._serve(r, path, {**commit, "ETag": f'"{ent["oid"]}"'})

        def _cdn(self, path: str) -> None:
            parts = path.strip("/").split("/")
            r = hub.repos.get("/".join(parts[:2])) if len(parts) >= 4 else None
            name = "/".join(parts[3:]) if r else ""
            if r is None or name not in r.files:
                return self._send(404, b"NoSuchKey", ctype="text/plain")
            self._serve(r, name, {"ETag": f'"{hashlib.sha256(r.files[name]).hexdigest()}"'})

        def _serve(self, r: Repo, path: str, headers: dict[str, str]) -> None:
            key = f"{r.id}/{path}"
            data = r.files[path]
            if key in hub.corrupt:
                i = len(data) // 2
                data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]
            size = len(data)
            start, end, status = 0, size, 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].split(",")[0].partition("-")
                start = int(a) if a else max(size - int(b), 0)
                end = min(int(b) + 1, size) if a and b else size
                if start >= size:
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, ctype="text/plain")
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command == "HEAD":
                return
            with hub._lock:
                cut = hub.cut_after.pop(key, None)
                hold = hub.hold_after.get(key)
            pos = start
            while pos < end:
                stop = min(pos + CHUNK, end)
                if cut is not None:
                    stop = min(stop, start + cut)
                if hold is not None and pos < hold:
                    stop = min(stop, hold)
                if hold is not None and pos == hold:
                    hub.release.wait()
                    hold = None
                    continue
                self.wfile.write(data[pos:stop])
                self.wfile.flush()
                with hub._lock:
                    hub.served[key] += stop - pos
                pos = stop
                if cut is not None and pos >= start + cut:  # drop the connection mid-body
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if hub.slow:
                    time.sleep(hub.slow)

    return Handler
