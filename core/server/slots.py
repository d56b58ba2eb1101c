"""llama-server's slot actions: ``POST /slots/{id}?action=save|restore|erase``, a slot's cache saved to a file,
read back, or forgotten (:mod:`~quantscope.core.engine.kvfile` for the file).

Only with ``serve --slot-save-path DIR`` (else 501, as llama-server answers); ``{"filename": NAME}`` names a file
in DIR: one file name, no folders, no absolute path, nothing Windows could not name (llama-server's
``fs_validate_filename`` rules; else 400 "Invalid filename"). An action waits for its slot to be idle and runs on
the scheduler's thread between steps (:meth:`~.scheduler.Scheduler.slot_task`), so no request joins the slot
halfway. A restore checks the whole file against the slot's session (model file, cache types, sizes) before the
slot is touched; a refused file leaves the slot as it was. Replies have llama-server's shapes: ``{id_slot,
filename, n_saved, n_written, timings: {save_ms}}``, ``{id_slot, filename, n_restored, n_read, timings:
{restore_ms}}``, ``{id_slot, n_erased}``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.kvfile import KVFileError, ModelKey, read_session_file, restore_session, save_session
from ..engine.session import Session
from ..fsutil import PathRefused, windows_name_problem
from .errors import ApiError, bad_request
from .scheduler import Scheduler, ServerStopped, Slot

Handler = Callable[[Request], Awaitable[Response]]

#: code points llama-server's fs_validate_filename refuses besides the controls: the reserved characters, their
#: full-width look-alikes, the replacement character and the byte order mark
_REFUSED = frozenset('/\\:*?"<>|') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def filename_problem(name: object) -> str | None:
    """Why ``name`` cannot name a slot file (llama-server's rules, plus Windows' reserved names), or None."""
    if not isinstance(name, str) or not name:
        return "a file name is needed"
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return "longer than 255 bytes"
    for ch in name:
        o = ord(ch)
        if o <= 0x1F or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or ch in _REFUSED:
            return f"it holds {ch!r}"
    if name[0] == " " or name[-1] in " .":
        return "it begins with a space or ends with a space or a dot"
    return windows_name_problem(name)


class SlotActions:
    """The ``/slots/{id}`` endpoint over ``scheduler``'s slots, serving the model file ``model_path``, with files in
    ``folder`` (None: off); ``read_json`` reads a request's JSON body with the app's checks."""

    def __init__(self, scheduler: Scheduler, model_path: str | os.PathLike[str], folder: str | None,
                 read_json: Callable[[Request], Awaitable[dict[str, Any]]]) -> None:
        self.scheduler = scheduler
        self.model_path = model_path
        self.folder = Path(folder) if folder is not None else None
        self.read_json = read_json
        self._key: ModelKey | None = None

    def routes(self, wrap: Callable[[Handler], Handler]) -> list[Route]:
        """The route, its handler wrapped by the app's ``wrap`` (the API key, the error shape)."""
        return [Route("/slots/{id_slot}", wrap(self.action), methods=["POST"])]

    @property
    def key(self) -> ModelKey:
        """The served model file's identity (computed once)."""
        if self._key is None:
            self._key = ModelKey.of(self.model_path)
        return self._key

    async def action(self, request: Request) -> Response:
        if self.folder is None:
            raise ApiError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                           code="not_supported")
        sched = self.scheduler
        try:
            index = int(request.path_params["id_slot"])
        except ValueError:
            raise bad_request("Invalid slot ID", param="id_slot") from None
        if not 0 <= index < len(sched.slots):
            raise bad_request("Invalid slot ID", param="id_slot")
        what = request.query_params.get("action", "")
        if what not in ("save", "restore", "erase"):
            raise bad_request("Invalid action", param="action")
        name = ""
        if what != "erase":
            body = await self.read_json(request)
            name = body.get("filename")  # type: ignore[assignment]
            problem = filename_problem(name)
            if problem is not None:
                raise bad_request(f"Invalid filename: {problem}", param="filename")
            if type(sched.slots[index].session) is not Session:
                raise ApiError(501, "slot files need the CPU engine (this slot's cache is on the GPU)",
                               code="not_supported")
            _ = self.key  # (hashed here, off the scheduler's thread)
        path = self.folder / name
        fn = {"save": lambda s: self._save(s, path), "restore": lambda s: self._restore(s, path),
              "erase": self._erase}[what]
        try:
            fut = sched.slot_task(index, fn)
        except ServerStopped as exc:
            raise ApiError(503, str(exc)) from None
        try:
            result = await asyncio.wrap_future(fut)
        except ServerStopped as exc:
            raise ApiError(503, str(exc)) from None
        except (KVFileError, PathRefused) as exc:  # (the folder's path is the server's business: the name only)
            raise bad_request(f"Unable to {what} slot: {str(exc).replace(str(path), name)}") from None
        except OSError as exc:
            raise ApiError(500, f"Unable to {what} slot: {exc.strerror or exc}") from None
        return JSONResponse({"id_slot": index, **result})

    def _save(self, slot: Slot, path: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        s = slot.session
        assert isinstance(s, Session)
        tokens = slot.cached[: s.n_past]
        size = save_session(path, s, tokens, self.key)
        return {"filename": path.name, "n_saved": len(tokens), "n_written": size,
                "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}

    def _restore(self, slot: Slot, path: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        s = slot.session
        assert isinstance(s, Session)
        saved = read_session_file(path, s, self.key)  # every check first: a refused file leaves the slot alone
        restore_session(s, saved)
        slot.cached, slot.memo = list(saved.tokens), None
        return {"filename": path.name, "n_restored": len(saved.tokens), "n_read": path.stat().st_size,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}

    @staticmethod
    def _erase(slot: Slot) -> dict[str, Any]:
        n = len(slot.cached)
        slot.session.reset()  # type: ignore[attr-defined]
        slot.cached, slot.memo = [], None
        return {"n_erased": n}
