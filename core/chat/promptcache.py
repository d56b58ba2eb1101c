"""The chat's prompt cache: a conversation's KV cache kept on disk, so that reopening it (or switching back to it)
with the same model file reads its cache from a file instead of evaluating the whole conversation again.

After each reply the engine's cache (the conversation's tokens so far and their cache arrays) is saved as one
file (:mod:`~quantscope.core.engine.kvfile`) named by the model file's identity and the tokens' hash, in
``prompt-cache`` beside the conversations (:func:`~.store.data_dir`); files of the same model whose tokens the new
file begins with are deleted (the earlier turns of that conversation). Before a prompt is evaluated, the file of
this model sharing the longest start with it is restored when that saves evaluating more than the engine's own
cache would (:meth:`PromptCache.restore`). The folder is held under ``max_bytes``: the least recently used files
go first. Only CPU sessions keep their caches where a file can take them; other sessions are left alone. A file
that cannot be read (damaged, another format) is deleted and the prompt evaluated as usual.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..engine.kvfile import KVFileError, ModelKey, read_session_file, read_tokens, restore_session, save_session
from ..engine.session import Session
from ..filestate import FileStamp
from ..fsutil import PathRefused
from .store import data_dir
from .tokens import common_prefix

#: the folder's default bound
DEFAULT_MAX_BYTES = 2 << 30
#: a file is restored only when it saves evaluating at least this many more tokens than the engine's own cache
MIN_GAIN = 16
SUFFIX = ".qskv"


class CachedEngine(Protocol):
    """What the cache uses of an :class:`~quantscope.core.engine.generate.Engine`."""

    session: Any
    cached: list[int]

    def set_cached(self, tokens: list[int]) -> None: ...


def default_folder() -> Path:
    """``prompt-cache`` in the app's data folder."""
    return data_dir() / "prompt-cache"


@dataclass
class Restored:
    """What :meth:`PromptCache.restore` did: the tokens now reusable from the file restored (its name)."""

    tokens: int
    file: str


class PromptCache:
    """Conversation caches of the model file ``model_path`` in ``folder`` (default :func:`default_folder`),
    at most ``max_bytes`` of them."""

    def __init__(self, model_path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = Path(folder) if folder is not None else default_folder()
        self.max_bytes = max_bytes
        self.model_path = Path(model_path)
        self._key: tuple[FileStamp | None, ModelKey] | None = None

    @property
    def key(self) -> ModelKey:
        """The model file's identity (hashed again only when the file changed)."""
        stamp = FileStamp.of(self.model_path)
        if self._key is None or self._key[0] != stamp:
            self._key = (stamp, ModelKey.of(self.model_path))
        return self._key[1]

    def _files(self) -> list[Path]:
        """This model's cache files."""
        try:
            return sorted(self.folder.glob(f"{self.key.identity}-*{SUFFIX}"))
        except OSError:
            return []

    def _tokens(self, path: Path, n_vocab: int) -> list[int] | None:
        """A file's tokens; None (and the file deleted) when it cannot be read."""
        try:
            return read_tokens(path, self.key, n_vocab)
        except (KVFileError, PathRefused, OSError):
            path.unlink(missing_ok=True)
            return None

    def restore(self, engine: CachedEngine, ids: list[int]) -> Restored | None:
        """Before evaluating the prompt ``ids``: restore the file sharing the longest start with it into the
        engine's session when that reuses at least :data:`MIN_GAIN` more tokens than the engine's cache does now
        (at most all but the prompt's last token); None when nothing was restored."""
        s = engine.session
        if type(s) is not Session:
            return None
        have = common_prefix(engine.cached, ids)
        best: tuple[int, Path] | None = None
        for f in self._files():
            toks = self._tokens(f, s.model.config.n_vocab)
            if toks is None:
                continue
            n = min(common_prefix(toks, ids), len(ids) - 1)
            if s.recurrent and n < len(toks):
                continue  # a recurrent state rewinds only to where it was saved
            if n >= have + MIN_GAIN and (best is None or n > best[0]):
                best = (n, f)
        if best is None:
            return None
        n, f = best
        try:
            saved = read_session_file(f, s, self.key)  # every check before the session is touched
        except (KVFileError, PathRefused, OSError):
            f.unlink(missing_ok=True)
            return None
        restore_session(s, saved)
        s.truncate(n)
        engine.set_cached(saved.tokens[: s.n_past])
        _touch(f)
        return Restored(s.n_past, f.name)

    def store(self, engine: CachedEngine) -> Path | None:
        """Save the engine's cache (after a reply), delete this model's files it supersedes (their tokens are a
        start of its own) and bound the folder; the file, or None when the session cannot be saved."""
        s = engine.session
        toks = list(engine.cached)
        if type(s) is not Session or not toks or len(toks) != s.n_past:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(np.asarray(toks, dtype="<i4").tobytes()).hexdigest()[:24]
        path = self.folder / f"{self.key.identity}-{digest}{SUFFIX}"
        for f in self._files():
            if f != path:
                old = self._tokens(f, s.model.config.n_vocab)
                if old is not None and toks[: len(old)] == old:
                    f.unlink(missing_ok=True)
        save_session(path, s, toks, self.key)
        self.evict(keep=path)
        return path

    def evict(self, keep: Path | None = None) -> None:
        """Delete the least recently used cache files (any model's) until the folder holds at most
        ``max_bytes`` (``keep`` last of all)."""
        try:
            files = [(f.stat(), f) for f in self.folder.glob(f"*{SUFFIX}")]
        except OSError:
            return
        total = sum(st.st_size for st, _f in files)
        for st, f in sorted(files, key=lambda e: (e[1] == keep, e[0].st_mtime_ns)):
            if total <= self.max_bytes:
                break
            f.unlink(missing_ok=True)
            total -= st.st_size




def _touch(path: Path) -> None:
    """Mark a file used now (its modification time: what eviction goes by)."""
    try:
        path.touch()
    except OSError:
        pass
