"""A hub that takes commits, on 127.0.0.1, for the real ``huggingface_hub`` client (``HF_ENDPOINT`` pointed at it,
``HF_HUB_DISABLE_XET=1``: the client's own switch to its HTTP LFS path): the routes ``create_repo`` and
``create_commit`` use — repository creation, preupload (large files go by LFS), the LFS batch API with a basic
PUT upload and its verify step, the README's front-matter check and the NDJSON commit. What it received is kept by
repository and path, with the tokens it saw; a repository named ``*/forbidden`` answers 403 as the hub does without
write access."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

LFS_AT = 1024  # files this large or larger go by LFS


@dataclass
class Hub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    commits: list[dict[str, object]] = field(default_factory=list)
    validated: list[dict[str, object]] = field(default_factory=list)
    url: str = ""

    def _auth(self, request: Request, repo: str) -> Response | None:
        self.tokens.append(request.headers.get("authorization", ""))
        if repo.endswith("/forbidden"):
            return JSONResponse({"error": "You don't have the rights to create a model under this namespace"},
                                status_code=403, headers={"X-Error-Message": "You don't have the rights"})
        return None

    async def create(self, request: Request) -> Response:
        body = await request.json()
        repo = f"{body.get('organization') or 'me'}/{body['name']}"
        if (denied := self._auth(request, repo)) is not None:
            return denied
        if repo in self.repos:
            return JSONResponse({"error": "You already created this model repo", "url": f"{self.url}/{repo}"},
                                status_code=409)
        self.repos[repo] = {}
        return JSONResponse({"url": f"{self.url}/{repo}", "name": repo})

    async def preupload(self, request: Request) -> Response:
        body = await request.json()
        files = [{"path": f["path"], "uploadMode": "lfs" if f["size"] >= LFS_AT else "regular",
                  "shouldIgnore": False} for f in body["files"]]
        return JSONResponse({"files": files})

    async def batch(self, request: Request) -> Response:
        body = await request.json()
        objects = []
        for o in body["objects"]:
            entry: dict[str, object] = {"oid": o["oid"], "size": o["size"]}
            if o["oid"] not in self.blobs:
                entry["actions"] = {"upload": {"href": f"{self.url}/lfs-put/{o['oid']}"},
                                    "verify": {"href": f"{self.url}/lfs-verify"}}
            objects.append(entry)
        return JSONResponse({"transfer": "basic", "objects": objects})

    async def put(self, request: Request) -> Response:
        data = await request.body()
        oid = request.path_params["oid"]
        if hashlib.sha256(data).hexdigest() != oid:
            return JSONResponse({"error": "sha256 mismatch"}, status_code=400)
        self.blobs[oid] = data
        return Response(status_code=200)

    async def verify(self, request: Request) -> Response:
        body = await request.json()
        ok = body.get("oid") in self.blobs and len(self.blobs[body["oid"]]) == body.get("size")
        return JSONResponse({"ok": ok}, status_code=200 if ok else 404)

    async def validate_yaml(self, request: Request) -> Response:
        """The hub's README check: a YAML front matter that parses to a mapping."""
        import yaml

        content = (await request.json()).get("content", "")
        parts = content.split("---", 2)
        try:
            meta = yaml.safe_load(parts[1]) if content.startswith("---") and len(parts) == 3 else None
        except yaml.YAMLError as exc:
            meta = exc
        if not isinstance(meta, dict):
            return JSONResponse({"errors": [{"message": f"invalid front matter: {meta!r}"}]}, status_code=400)
        self.validated.append(meta)
        return JSONResponse({"warnings": []})

    async def commit(self, request: Request) -> Response:
        repo = f"{request.path_params['ns']}/{request.path_params['name']}"
        if (denied := self._auth(request, repo)) is not None:
            return denied
        if repo not in self.repos:
            return JSONResponse({"error": "Repository not found"}, status_code=404)
        lines = [json.loads(x) for x in (await request.body()).splitlines() if x.strip()]
        header = next(x["value"] for x in lines if x["key"] == "header")
        for x in lines:
            v = x["value"]
            if x["key"] == "file":
                self.repos[repo][v["path"]] = base64.b64decode(v["content"])
            elif x["key"] == "lfsFile":
                if v["oid"] not in self.blobs:
                    return JSONResponse({"error": f"LFS object {v['oid']} was not uploaded"}, status_code=422)
                self.repos[repo][v["path"]] = self.blobs[v["oid"]]
        oid = hashlib.sha1(json.dumps(lines).encode()).hexdigest()
        self.commits.append({"repo": repo, "summary": header["summary"], "oid": oid})
        return JSONResponse({"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid,
                             "pullRequestUrl": None})

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/api/repos/create", self.create, methods=["POST"]),
            Route("/api/validate-yaml", self.validate_yaml, methods=["POST"]),
            Route("/api/models/{ns}/{name}/preupload/{rev}", self.preupload, methods=["POST"]),
            Route("/api/models/{ns}/{name}/commit/{rev}", self.commit, methods=["POST"]),
            Route("/{ns}/{name}.git/info/lfs/objects/batch", self.batch, methods=["POST"]),
            Route("/lfs-put/{oid}", self.put, methods=["PUT"]),
            Route("/lfs-verify", self.verify, methods=["POST"]),
        ])


@contextmanager
def running_hub() -> Iterator[Hub]:
    """A :class:`Hub` served on a free port of 127.0.0.1 for the duration of the block."""
    hub = Hub()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    hub.url = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(hub.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield hub
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
