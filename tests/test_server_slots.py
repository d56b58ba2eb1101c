"""``POST /slots/{id}?action=save|restore|erase`` (core/server/slots.py): a slot's cache saved to a file under
``--slot-save-path`` and restored into another slot, whose next request then reads its prompt from the cache and
answers the same; llama-server's reply shapes; refused names (folders, absolute paths, ``..``), slots, actions
and files; and the whole endpoint refused without the option. SmolLM2 on a real server, raw HTTP."""

from __future__ import annotations

import http.client as httplib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantscope.core.server import Server

from .server_helpers import serving

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("slots") / "saved"  # made by the server


@pytest.fixture(scope="module")
def server(model_path: Any, folder: Path) -> Iterator[Server]:
    with serving(model_path("smollm2"), parallel=2, slot_save_path=str(folder)) as srv:
        yield srv


def post(srv: Server, path: str, body: Any = None) -> tuple[int, Any]:
    conn = httplib.HTTPConnection(srv.host, srv.port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def complete(srv: Server) -> dict[str, Any]:
    status, body = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert status == 200, body
    return body


def test_save_erase_restore_into_another_slot(server: Server, folder: Path) -> None:
    first = complete(server)
    slot = next(s for s in server.scheduler.slots if s.cached)
    n = len(slot.cached)
    status, saved = post(server, f"/slots/{slot.index}?action=save", {"filename": "colours.bin"})
    assert status == 200, saved
    assert saved["id_slot"] == slot.index and saved["filename"] == "colours.bin" and saved["n_saved"] == n
    assert saved["n_written"] == (folder / "colours.bin").stat().st_size and saved["timings"]["save_ms"] >= 0
    status, erased = post(server, f"/slots/{slot.index}?action=erase")
    assert status == 200 and erased == {"id_slot": slot.index, "n_erased": n}
    other = 1 - slot.index
    status, restored = post(server, f"/slots/{other}?action=restore", {"filename": "colours.bin"})
    assert status == 200, restored
    assert restored["id_slot"] == other and restored["n_restored"] == n
    assert restored["n_read"] == saved["n_written"] and "restore_ms" in restored["timings"]
    again = complete(server)  # goes to the restored slot, its prompt read from the cache
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("name", ["../escape.bin", "/tmp/abs.bin", "sub/dir.bin", "a\\b", "", "dot.", " lead",
                                  "CON", "nul.txt", "x" * 256, "q?.bin", "tab\t", 5, None])
def test_bad_file_names_are_refused(server: Server, folder: Path, name: Any) -> None:
    for action in ("save", "restore"):
        status, body = post(server, f"/slots/0?action={action}", {"filename": name})
        assert status == 400 and body["error"]["message"].startswith("Invalid filename"), body
    assert not (folder.parent / "escape.bin").exists()


def test_bad_slots_actions_and_files(server: Server, folder: Path) -> None:
    for path in ("/slots/2?action=erase", "/slots/-1?action=erase", "/slots/x?action=erase"):
        status, body = post(server, path)
        assert status == 400 and body["error"]["message"] == "Invalid slot ID"
    status, body = post(server, "/slots/0?action=dump", {"filename": "a"})
    assert status == 400 and body["error"]["message"] == "Invalid action"
    status, body = post(server, "/slots/0?action=restore", {"filename": "missing.bin"})
    assert status == 400 and body["error"]["message"] == "Unable to restore slot: missing.bin: no such file"
    assert str(folder) not in body["error"]["message"]
    # a damaged file: refused, and the slot keeps what it had
    complete(server)
    slot = next(s for s in server.scheduler.slots if s.cached)
    status, _ = post(server, f"/slots/{slot.index}?action=save", {"filename": "good.bin"})
    assert status == 200
    data = (folder / "good.bin").read_bytes()
    (folder / "cut.bin").write_bytes(data[: len(data) // 2])
    (folder / "junk.bin").write_bytes(b"GGUF" + data[4:])
    before = list(slot.cached)
    for bad in ("cut.bin", "junk.bin"):
        status, body = post(server, f"/slots/{slot.index}?action=restore", {"filename": bad})
        assert status == 400 and body["error"]["message"].startswith("Unable to restore slot: "), body
    assert slot.cached == before
    again = complete(server)  # the same prompt: read from the slot's cache as before (all of it: its logits kept)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"]


def test_without_the_option_every_action_is_refused(model_path: Any, tmp_path: Path) -> None:
    with serving(model_path("smollm2"), n_ctx=64) as srv:
        for action, body in (("save", {"filename": "a.bin"}), ("restore", {"filename": "a.bin"}), ("erase", None)):
            status, reply = post(srv, f"/slots/0?action={action}", body)
            assert status == 501 and "--slot-save-path" in reply["error"]["message"]
            assert reply["error"]["type"] == "not_supported_error"
