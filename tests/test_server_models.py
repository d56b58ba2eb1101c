"""Several models behind one server (core/server/models.py, ``quantscope serve --models``): real servers on
127.0.0.1 over a folder of the three catalogue models (and a file that is no GGUF), driven by the real ``openai``,
``ollama`` and ``anthropic`` clients: the listings, loading on first use, two models in turn, idle unloading (seen
by polling /api/ps), least-recently-used unloading under a count and a memory budget, requests that wait for a load
(and for room held by a model in use), unknown models as 404s in each dialect, a file that fails to load, and the
command line. States are waited for by polling, never by sleeping a guessed time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from quantscope.cli.main import main
from quantscope.core.library import Store
from quantscope.core.server import LoadOptions, ModelPool, PoolServer, ServerConfig, model_id_of
from quantscope.core.server.models import MODEL_PATHS, find_offers, gguf_files, keep_alive_seconds, library_paths

KEY = "pool-key-1"
ASK = [{"role": "user", "content": "Name a colour."}]
OPTIONS = LoadOptions(n_ctx=256, threads=1, backend="cpu")
#: a generous bound for a state to be reached (a load, an unload): only a hang runs into it
PATIENCE = 300.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: Any, model_path: Callable[[str], Path]) -> Path:
    """The three catalogue models (links) and a file named like a model that is not one."""
    d = tmp_path_factory.mktemp("models")
    for name in ("smollm2", "gemma3", "qwen2.5-coder"):
        src = model_path(name)
        (d / src.name).symlink_to(src)
    (d / "junk.gguf").write_bytes(b"not a model at all" * 64)
    return d


@pytest.fixture(scope="module")
def names(model_path: Callable[[str], Path]) -> tuple[str, str, str]:
    return tuple(model_id_of(model_path(n)) for n in ("smollm2", "gemma3", "qwen2.5-coder"))  # type: ignore[return-value]


def make_pool(folder: Path, **kw: Any) -> ModelPool:
    offers, broken = find_offers([(model_id_of(p), p) for p in gguf_files([folder])], OPTIONS)
    return ModelPool(offers, OPTIONS, ServerConfig("", KEY), broken=broken, **kw)


@contextlib.contextmanager
def serving(folder: Path, **kw: Any) -> Iterator[PoolServer]:
    srv = PoolServer(make_pool(folder, **kw), port=0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[PoolServer]:
    """No idle unloading and no limit but memory: models stay once loaded."""
    with serving(folder, idle_unload=None) as srv:
        yield srv


def oai(srv: PoolServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=PATIENCE)


def oll(srv: PoolServer) -> ollama.Client:
    return ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=PATIENCE)


def ant(srv: PoolServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0, timeout=PATIENCE)


def ask(srv: PoolServer, model: str) -> str:
    r = oai(srv).chat.completions.create(model=model, messages=ASK, max_tokens=3, temperature=0)  # type: ignore
    assert r.model == model and r.usage is not None and r.usage.completion_tokens >= 1
    return r.choices[0].message.content or ""


def loaded(srv: PoolServer) -> set[str]:
    """What /api/ps says is loaded."""
    return {m.model or "" for m in oll(srv).ps().models}


def wait_until(what: Callable[[], bool], why: str) -> None:
    end = time.monotonic() + PATIENCE
    while not what():
        assert time.monotonic() < end, f"never happened: {why}"
        time.sleep(0.02)


def metric(srv: PoolServer, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=PATIENCE).text
    m = re.search(rf"^quantscope_{name} (\S+)$", text, re.MULTILINE)
    assert m, text
    return float(m.group(1))


# ------------------------------------------------------------------------------------------------ one server
def test_everything_is_listed_and_nothing_loaded_before_use(folder: Path, names: tuple[str, ...]) -> None:
    with serving(folder) as server:
        listed_before_use(server, names)


def listed_before_use(server: PoolServer, names: tuple[str, ...]) -> None:
    listed = {m.id: m for m in oai(server).models.list().data}
    assert set(listed) == set(names)  # junk.gguf is not listed: it cannot be served
    meta = listed[names[0]].model_extra["meta"]  # type: ignore[index]
    assert meta["loaded"] is False and meta["arch"] == "llama" and meta["memory"] > 0
    tags = {m.model: m for m in oll(server).list().models}
    assert set(tags) == set(names)
    assert tags[names[1]].details is not None and tags[names[1]].details.family == "gemma3"
    assert len(tags[names[2]].digest or "") == 64
    assert loaded(server) == set()
    health = httpx.get(server.url + "/health", timeout=PATIENCE).json()  # open without the key
    assert health["status"] == "ok" and health["models"] == 3 and health["loaded"] == []
    assert httpx.get(server.url + "/v1/models", timeout=PATIENCE).status_code == 401


def test_first_use_loads_and_two_models_take_turns(server: PoolServer, names: tuple[str, ...]) -> None:
    a, b = names[0], names[1]
    before = metric(server, "model_loads_total") + len({a, b} & loaded(server))
    assert ask(server, a)
    assert loaded(server) >= {a}
    r = oll(server).chat(model=b + ":latest", messages=ASK, options={"temperature": 0, "num_predict": 3})
    assert r.model == b and r.message.content
    assert ask(server, a)
    m = ant(server).messages.create(model=b, max_tokens=3, messages=ASK)  # type: ignore[arg-type]
    assert m.model == b and m.usage.output_tokens >= 1
    assert loaded(server) >= {a, b}
    assert metric(server, "model_loads_total") - before == 2  # each loaded once, then reused
    ps = {m.model: m for m in oll(server).ps().models}
    assert ps[a].context_length == 256 and ps[a].size_vram == 0


def test_an_unknown_model_is_a_404_in_each_dialect(server: PoolServer, names: tuple[str, ...]) -> None:
    with pytest.raises(openai.NotFoundError) as e1:
        oai(server).chat.completions.create(model="no-such-model", messages=ASK)  # type: ignore[arg-type]
    assert "'no-such-model' does not exist" in str(e1.value) and names[0] in str(e1.value)
    assert e1.value.code == "model_not_found"
    with pytest.raises(ollama.ResponseError) as e2:
        oll(server).generate(model="no-such-model", prompt="hi")
    assert e2.value.status_code == 404 and "does not exist" in e2.value.error
    with pytest.raises(anthropic.NotFoundError) as e3:
        ant(server).messages.create(model="no-such-model", max_tokens=3, messages=ASK)  # type: ignore[arg-type]
    assert e3.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    # the file that is no GGUF: not listed, and asking for it says why in one line
    with pytest.raises(openai.NotFoundError) as e4:
        oai(server).chat.completions.create(model="junk", messages=ASK)  # type: ignore[arg-type]
    assert "junk.gguf is not a readable GGUF file" in str(e4.value) and "\n" not in e4.value.message
    # several models and none named: said, not guessed
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=PATIENCE)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_required"
    # nothing loads for a client without the key, nor for a body that is refused anyway
    r = httpx.post(server.url + "/api/chat", json={"model": names[2], "messages": ASK}, timeout=PATIENCE)
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    url = server.url + "/v1/chat/completions"
    r = httpx.post(url, content=json.dumps({"model": names[2], "messages": ASK}),
                   headers=auth | {"Content-Type": "text/plain"}, timeout=PATIENCE)
    assert r.status_code == 415
    r = httpx.post(url, content=b'{"model": "%s", "temperature": NaN}' % names[2].encode(),
                   headers=auth | {"Content-Type": "application/json"}, timeout=PATIENCE)
    assert r.status_code == 400 and "NaN" in r.json()["error"]["message"]
    r = httpx.post(url, content=json.dumps({"model": names[2], "messages": ASK, "pad": "x" * (9 << 20)}),
                   headers=auth | {"Content-Type": "application/json"}, timeout=PATIENCE)
    assert r.status_code == 413
    assert names[2] not in loaded(server)


def test_the_pool_hands_on_every_post_endpoint_of_a_model(server: PoolServer, names: tuple[str, ...]) -> None:
    """MODEL_PATHS is every POST route of a model's own server (an endpoint added there is handed on too)."""
    ask(server, names[0])
    app = server.pool.loaded[names[0]].app
    assert app is not None
    posts = {r.path for r in app.app.routes if "POST" in (getattr(r, "methods", None) or ())}
    assert posts == MODEL_PATHS


# ------------------------------------------------------------------------------------------------ loading
def test_requests_during_a_load_wait_for_it_and_share_it(folder: Path, names: tuple[str, ...]) -> None:
    with serving(folder, idle_unload=None) as srv:
        start = threading.Barrier(4)
        out: list[Any] = []

        def one() -> None:
            start.wait()
            try:
                out.append(ask(srv, names[1]))
            except Exception as exc:  # reported below
                out.append(exc)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(isinstance(x, str) and x for x in out), out
        assert srv.pool.loads == 1 and loaded(srv) == {names[1]}


def test_an_idle_model_is_unloaded_and_loads_again(folder: Path, names: tuple[str, ...]) -> None:
    with serving(folder, idle_unload=0.2) as srv:
        assert ask(srv, names[0])
        wait_until(lambda: loaded(srv) == set(), "the idle model unloaded")
        assert metric(srv, "model_unloads_total") == 1
        assert ask(srv, names[0])
        assert metric(srv, "model_loads_total") == 2


def test_ollamas_keep_alive_sets_how_long_a_model_stays(folder: Path, names: tuple[str, ...]) -> None:
    a, b, _c = names
    with serving(folder, idle_unload=None) as srv:
        client = oll(srv)
        client.generate(model=b, prompt="Hi", options={"num_predict": 2}, keep_alive=-1)
        client.generate(model=a, prompt="Hi", options={"num_predict": 2}, keep_alive="1h")
        ps = {m.model: m for m in client.ps().models}
        assert ps[b].expires_at is not None and ps[b].expires_at.year == 2318  # for ever
        assert ps[a].expires_at is not None and ps[a].expires_at.year < 2318
        client.generate(model=a, prompt="Hi", options={"num_predict": 2}, keep_alive=0)
        wait_until(lambda: loaded(srv) == {b}, "the model kept 0 s unloaded")
        # Ollama's "unload" (`ollama stop`): nothing to generate, keep_alive 0; a model not loaded stays so
        r = client.generate(model=b, keep_alive=0)
        assert r.done_reason == "unload" and loaded(srv) == set()
        r2 = client.chat(model=a, messages=[], keep_alive=0)
        assert r2.done_reason == "unload" and loaded(srv) == set() and srv.pool.loads == 2


def test_keep_alive_values() -> None:
    assert keep_alive_seconds("5m") == 300 and keep_alive_seconds("1h30m") == 5400
    assert keep_alive_seconds(90) == 90 and keep_alive_seconds("90") == 90 and keep_alive_seconds("0") == 0
    assert keep_alive_seconds(-1) is None and keep_alive_seconds("-1m") is None
    unset = keep_alive_seconds(None)
    assert all(keep_alive_seconds(v) is unset for v in ("soon", "5 m", True, [1], float("nan"), "x" * 40))


def test_the_least_recently_used_is_unloaded_past_max_loaded(folder: Path, names: tuple[str, ...]) -> None:
    a, b, _c = names
    with serving(folder, idle_unload=None, max_loaded=1) as srv:
        ask(srv, a)
        ask(srv, b)
        assert loaded(srv) == {b}
        ask(srv, a)
        assert loaded(srv) == {a}
        assert srv.pool.unloads == 2


def test_the_least_recently_used_is_unloaded_past_the_memory_budget(folder: Path, names: tuple[str, ...]) -> None:
    a, b, c = names
    need = {o.id: o.need for o in make_pool(folder).offers.values()}
    assert need[a] < need[b] < need[c]
    with serving(folder, idle_unload=None, budget=need[b] + need[c]) as srv:
        for m in (a, b, a):
            ask(srv, m)
        assert loaded(srv) == {a, b}
        ask(srv, c)  # a + b + c exceed the budget: b, used longest ago, goes; a + c fit
        assert loaded(srv) == {a, c}
        assert metric(srv, "models_memory_bytes") == need[a] + need[c]
    with serving(folder, idle_unload=None, budget=need[a]) as srv:  # a model larger than the budget: refused
        with pytest.raises(openai.APIStatusError) as e:
            ask(srv, c)
        assert e.value.status_code == 503 and "memory budget" in e.value.message and "\n" not in e.value.message
        assert ask(srv, a)


def test_a_model_in_use_is_never_unloaded(folder: Path, names: tuple[str, ...]) -> None:
    """The pool itself, in an event loop: with room for one model, a load of another waits while the first is
    held by a request, and goes ahead when it is released; two requests for a model being loaded share one load."""
    a, b, _c = names
    pool = make_pool(folder, idle_unload=None, max_loaded=1)

    async def scenario() -> None:
        first = await pool.acquire(pool.offers[a])
        wanted = asyncio.ensure_future(asyncio.gather(pool.acquire(pool.offers[b]), pool.acquire(pool.offers[b])))
        while pool.waiting_for_room != b:  # the load of b waits: a is in use
            assert not wanted.done()
            await asyncio.sleep(0.01)
        assert first.app is not None and pool.loaded[a] is first
        pool.release(first)
        x, y = await wanted
        assert x is y and x.app is not None and x.users == 2
        assert a not in pool.loaded and first.app is None and pool.loads == 2 and pool.unloads == 1
        pool.release(x)
        pool.release(y)

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_a_file_that_fails_to_load_is_one_error_and_the_others_serve_on(tmp_path: Path, folder: Path,
                                                                          names: tuple[str, ...]) -> None:
    d = tmp_path / "two"
    d.mkdir()
    (d / "good.gguf").symlink_to(folder / f"{names[0]}.gguf")
    shutil.copyfile(folder / f"{names[0]}.gguf", d / "bad.gguf")
    with serving(d, idle_unload=None) as srv:
        assert {m.id for m in oai(srv).models.list().data} == {"good", "bad"}
        (d / "bad.gguf").write_bytes(b"overwritten after the server listed it" * 100)
        for _ in range(2):  # each request for it is told, in one line
            with pytest.raises(openai.InternalServerError) as e:
                ask(srv, "bad")
            body: Any = e.value.body
            assert body["code"] == "model_load_failed" and "\n" not in body["message"]
            assert body["message"].startswith("cannot load 'bad' (bad.gguf): at byte 0 (0x0): bad magic")
        with pytest.raises(ollama.ResponseError) as e2:
            oll(srv).chat(model="bad", messages=ASK)
        assert e2.value.status_code == 500 and "cannot load 'bad'" in e2.value.error
        assert ask(srv, "good") and loaded(srv) == {"good"}
        assert metric(srv, "model_load_failures_total") == 3


def test_the_librarys_models_are_served_by_their_names(tmp_path: Path, folder: Path, names: tuple[str, ...]) -> None:
    """An Ollama store's model by its ``name:tag`` (its file is a blob named by its digest), a folder's by file."""
    digest = "ab" * 32
    root = tmp_path / "ollama"
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1}]}))
    (root / "blobs").mkdir()
    (root / "blobs" / f"sha256-{digest}").symlink_to(folder / f"{names[0]}.gguf")
    named = library_paths([Store("ollama", root), Store("folder", folder)], cache=tmp_path / "scan.json")
    assert sorted(n for n, _p in named) == sorted(["tiny:latest", *names])  # junk.gguf: its header is unreadable
    offers, _broken = find_offers(named, OPTIONS, unique=False)
    pool = ModelPool(offers, OPTIONS, ServerConfig("", KEY), idle_unload=None)
    srv = PoolServer(pool, port=0)
    srv.start()
    try:
        r = oll(srv).generate(model="tiny", prompt="Hi", options={"temperature": 0, "num_predict": 2})
        assert r.model == "tiny:latest" and r.response
        assert "tiny:latest" in {m.model for m in oll(srv).list().models}
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------------ command line
def run(capsys: Any, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def test_command_line_refusals_are_one_line(capsys: Any, tmp_path: Path, folder: Path, model_path: Any) -> None:
    one = str(model_path("smollm2"))
    cases = [
        ((one, "--models", str(folder)), "give one MODEL, or --models/--library for several, not both"),
        ((), "give the MODEL to serve, or --models DIR|FILE... (or --library) for several"),
        ((one, "--max-loaded", "2"), "--max-loaded is for several models (--models or --library)"),
        (("--models", str(tmp_path)), f"no model to serve in {tmp_path}"),
        (("--models", str(tmp_path / "nope")), f"--models: {tmp_path / 'nope'}: no such file or folder"),
    ]
    for args, message in cases:
        rc, err = run(capsys, "serve", "--port", "0", *args)
        assert rc == 2 and err == f"quantscope: error: {message}\n", args
    rc, err = run(capsys, "serve", "--models", str(folder), "--max-memory", "lots")
    assert rc == 2 and err.count("\n") == 1 and "--max-memory" in err


def test_serve_models_until_interrupted(tmp_path: Path, folder: Path, names: tuple[str, ...]) -> None:
    """The console script over a folder: the file that is no GGUF warned about, the models listed, one loaded on
    first use, Ctrl-C stops cleanly."""
    exe = os.path.join(os.path.dirname(sys.executable), "quantscope")
    proc = subprocess.Popen([exe, "serve", "--models", str(folder), "--port", "0", "-c", "128", "-t", "1",
                             "--backend", "cpu", "--max-loaded", "1", "--idle-unload", "60"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        warning = proc.stderr.readline()
        assert warning.startswith("warning: not serving junk: junk.gguf is not a readable GGUF file")
        line = proc.stderr.readline()
        m = re.search(r"^serving 3 models \(.*\) at (http://127\.0\.0\.1:\d+)/v1, each loaded on first use "
                      r"\(idle ones unloaded after 60 s; at most 1 loaded; within .*\); Ctrl-C stops$", line)
        assert m, line
        url = m.group(1)
        assert {d["id"] for d in httpx.get(url + "/v1/models", timeout=PATIENCE).json()["data"]} == set(names)
        r = httpx.post(url + "/v1/completions", json={"model": names[0], "prompt": "The capital of France is",
                                                      "max_tokens": 3, "temperature": 0}, timeout=PATIENCE)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert [p["model"] for p in httpx.get(url + "/api/ps", timeout=PATIENCE).json()["models"]] == [names[0]]
        assert re.fullmatch(rf"loaded {re.escape(names[0])} in \S+ s \(cpu, context 128, .*\)\n",
                            proc.stderr.readline())
        r = httpx.post(url + "/v1/completions", json={"model": names[1], "prompt": "Hi", "max_tokens": 2},
                       timeout=PATIENCE)
        assert r.status_code == 200
        assert proc.stderr.readline() == f"unloaded {names[0]} (room for {names[1]})\n"  # --max-loaded 1
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
