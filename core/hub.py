"""Models from the Hugging Face hub: search GGUF repositories, a repository's GGUFs grouped by quantization, a
remote file's header read over HTTP range requests (peek), and downloads into the Hugging Face cache layout.

``huggingface_hub`` does every request (``HF_ENDPOINT``, ``HF_TOKEN`` or a saved token, ``HF_HUB_OFFLINE``, the
cache under ``HF_HOME``/``HF_HUB_CACHE`` are its own); this module chooses the files, checks each download's SHA-256
against the hub's LFS record, removes a download that does not match, and says what went wrong in one line
(:class:`HubError`).

The client resumes a download whose connection was cut (a ranged request from the bytes it has) within a run; a
cancelled run leaves no partial file (the client writes to a temporary name it removes), so the next run starts
that file over.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .gguf import GGUFError, GGUFFile, NeedMoreBytes
from .jobs import CancelFlag, Cancelled, check_cancel
from .shardnames import shard_path

#: a peek fetches this much first, then more while the header goes on, never more than PEEK_LIMIT in all
PEEK_FIRST = 1 << 20
PEEK_LIMIT = 256 << 20
#: blocks a remote file keeps once fetched (a block is at most a few hundred bytes)
BLOCK_CACHE = 4096
SORTS = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
#: a quantization tag in a file name (llama.cpp's file types, unsloth's UD- variants), bounded by non-alphanumerics
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ\d_(?:XXS|XS|S|M|NL)|TQ\d_\d|Q\d_K(?:_(?:XL|XS|S|M|L))?|Q\d_\d|MXFP4(?:_MOE)?|"
    r"BF16|F16|F32|FP16|FP32))(?![A-Za-z0-9])", re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HubError(Exception):
    """Something the hub, the network or the cache refused, said in one line."""


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repository: its path in the repo, its size and (LFS files) the SHA-256 the hub recorded."""

    path: str
    size: int | None = None
    sha256: str | None = None


@dataclass
class QuantSet:
    """One model file of a repository, or a split set (every shard, in order), with its quantization tag from the
    name (``None`` when the name carries none)."""

    quant: str | None
    files: list[RemoteFile] = field(default_factory=list)
    problem: str | None = None  # a split set with shards missing on the hub

    @property
    def name(self) -> str:
        return self.files[0].path

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def shards(self) -> int:
        return len(self.files)


@dataclass(frozen=True)
class RepoHit:
    """A search result."""

    id: str
    downloads: int | None
    likes: int | None
    last_modified: str | None
    gated: bool


# ------------------------------------------------------------------------------------------------ names
def parse_repo_ref(text: str) -> tuple[str, str | None]:
    """``org/repo[:QUANT]`` (also ``hf.co/org/repo:QUANT`` and ``https://huggingface.co/org/repo``) -> (repo, quant)."""
    ref = re.sub(r"^(?:https?://)?(?:huggingface\.co|hf\.co)/", "", text.strip())
    repo, _, quant = ref.partition(":")
    repo = repo.strip("/")
    if not _REPO.match(repo) or ".." in repo:
        raise HubError(f"{text!r} is not a repository name: give it as org/repo or org/repo:QUANT (e.g. Q4_K_M)")
    return repo, (quant.strip() or None)


def parse_hf_url(text: str) -> tuple[str, str]:
    """``hf://org/repo/path/file.gguf`` -> (repo, path in the repo)."""
    rest = text[len("hf://"):] if text.startswith("hf://") else text
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts) or any(p in (".", "..") for p in parts):
        raise HubError(f"{text!r}: give a remote file as hf://org/repo/file.gguf")
    repo = "/".join(parts[:2])
    if not _REPO.match(repo):
        raise HubError(f"{text!r}: {repo!r} is not a repository name (org/repo)")
    return repo, "/".join(parts[2:])


def quant_of(path: str) -> str | None:
    """The quantization tag in a file's name (``Q4_K_M``, ``IQ2_XXS``, ``BF16``, ``UD-Q4_K_XL``), upper-cased; the
    last one when the name has several (``Qwen3-8B-Q8_0`` -> ``Q8_0``)."""
    found = _QUANT.findall(Path(path).name)
    return found[-1].upper() if found else None


def is_projector(path: str) -> bool:
    """A multimodal projector (``mmproj-*.gguf``): a companion file, not a model to choose."""
    return "mmproj" in Path(path).name.lower()


def gguf_sets(files: list[RemoteFile]) -> list[QuantSet]:
    """The repository's GGUF models: single files, and split sets gathered from their shards (a set with a shard
    missing keeps a ``problem``), projectors left out; sorted by size."""
    sets: dict[str, QuantSet] = {}
    wanted: dict[str, int] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf") or is_projector(f.path):
            continue
        m = _SHARD.search(f.path)
        key = f.path[: m.start()] if m and m.start() else f.path
        s = sets.setdefault(key, QuantSet(quant_of(key if m else f.path)))
        s.files.append(f)
        if m and m.start():
            wanted[key] = int(m.group(2))
    for key, count in wanted.items():
        s = sets[key]
        by_name = {f.path: f for f in s.files}
        names = [str(shard_path(key, i, count)) for i in range(count)]
        missing = [n for n in names if n not in by_name]
        s.files = [by_name[n] for n in names if n in by_name] + [f for f in s.files if f.path not in names]
        if missing or len(s.files) != count:
            s.problem = f"{len(missing)} of its {count} shards are missing on the hub"
    return sorted(sets.values(), key=lambda s: (s.size, s.name))


def select(sets: list[QuantSet], quant: str | None, repo: str) -> QuantSet:
    """The set for ``quant`` (case-insensitive); a repo with one GGUF needs none. Anything else is a
    :class:`HubError` that lists what the repository has."""
    if not sets:
        raise HubError(f"{repo} has no GGUF files")
    tags = list(dict.fromkeys(s.quant or s.name for s in sets))
    have = ", ".join(tags)
    if quant is None:
        if len(sets) == 1:
            return sets[0]
        raise HubError(f"{repo} has {len(sets)} GGUF models: choose one with {repo}:QUANT ({have})")
    want = quant.upper()
    hits = [s for s in sets if s.quant == want or s.name.lower() == quant.lower()]
    if not hits:  # llama.cpp's rule: a tag found anywhere in the name
        hits = [s for s in sets if want in Path(s.name).name.upper()]
    if not hits:
        raise HubError(f"{repo} has no {quant} file; it has {have}")
    if len(hits) > 1:
        raise HubError(f"{repo} has {len(hits)} {quant} models ({', '.join(s.name for s in hits)}): give the file "
                       f"name as {repo}:NAME")
    if hits[0].problem:
        raise HubError(f"{repo}: {hits[0].name}: {hits[0].problem}")
    return hits[0]


# ------------------------------------------------------------------------------------------------ the client
@contextmanager
def hub_errors(repo: str = "", what: str = "") -> Iterator[None]:
    """The client's exceptions as one :class:`HubError` line each."""
    from huggingface_hub import errors as e

    try:
        yield
    except HubError:
        raise
    except e.GatedRepoError:
        raise HubError(f"{repo} is gated: accept its terms on the hub, then set HF_TOKEN or save a token with "
                       "`hf auth login`") from None
    except e.RepositoryNotFoundError:
        raise HubError(f"{repo}: no such repository on the hub (a private one needs HF_TOKEN)") from None
    except e.RevisionNotFoundError:
        raise HubError(f"{repo}: no such revision on the hub") from None
    except e.EntryNotFoundError:
        raise HubError(f"{repo}: {what or 'the file'} is not in the repository") from None
    except e.OfflineModeIsEnabled:
        raise HubError(f"{repo}: HF_HUB_OFFLINE is set and {what or 'this'} is not in the cache") from None
    except e.LocalEntryNotFoundError:
        raise HubError(f"{repo}: {what or 'the file'} is not in the cache and the hub cannot be reached "
                       f"({_endpoint()})") from None
    except e.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(f"{repo}: the hub answered HTTP {status}: {_first_line(exc)}") from None
    except OSError as exc:
        raise HubError(f"{repo}: {_first_line(exc)}") from None
    except Exception as exc:
        import httpx2

        if isinstance(exc, httpx2.HTTPError):
            raise HubError(f"cannot reach the hub at {_endpoint()}: {_first_line(exc)}") from None
        raise


def quiet_client() -> None:
    """Keep the client's own warnings (retries, resumes) off stderr: a command says what happened in its one line."""
    from huggingface_hub.utils import logging

    logging.set_verbosity_error()


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _api() -> Any:
    from huggingface_hub import HfApi

    return HfApi()


def search(text: str, sort: str = "downloads", limit: int = 20) -> list[RepoHit]:
    """GGUF repositories whose name matches ``text``, most downloaded (liked, recently changed) first."""
    hits = []
    with hub_errors("search"):
        for m in _api().list_models(search=text or None, filter="gguf", sort=SORTS[sort], limit=limit,
                                    expand=["downloads", "likes", "lastModified", "gated"]):
            hits.append(RepoHit(m.id, m.downloads, m.likes,
                                m.last_modified.isoformat() if m.last_modified else None, bool(m.gated)))
    return hits


def repo_files(repo: str) -> list[RemoteFile]:
    """Every file of the repository's main revision with its size and LFS SHA-256 (the tree listing)."""
    from huggingface_hub import RepoFile

    with hub_errors(repo):
        return [RemoteFile(e.path, e.size, e.lfs.sha256 if e.lfs else None)
                for e in _api().list_repo_tree(repo, recursive=True) if isinstance(e, RepoFile)]


def cached_files(repo: str) -> list[RemoteFile]:
    """The repository's files already in the Hugging Face cache (what offline mode can use)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    out: dict[str, RemoteFile] = {}
    for r in info.repos:
        if r.repo_id != repo or r.repo_type != "model":
            continue
        for rev in r.revisions:
            for f in rev.files:
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                out.setdefault(rel, RemoteFile(rel, f.size_on_disk, None))
    return list(out.values())


# ------------------------------------------------------------------------------------------------ download
def _progress_class(progress: Callable[[str, int, int], None], name: str) -> Any:
    """A tqdm class for ``hf_hub_download`` that reports ``progress(name, done, total)`` and draws nothing."""
    from tqdm.auto import tqdm

    class Report(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            progress(name, self.done, int(self.total or 0))
            return None

    return Report


def sha256_file(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return h.hexdigest()


def _discard(pointer: Path) -> None:
    """Remove a download that failed its check: the blob, the snapshot link to it, and folders left empty."""
    blob = Path(os.path.realpath(pointer))
    for p in (pointer, blob):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    for d in (pointer.parent, blob.parent):
        try:
            d.rmdir()
        except OSError:
            pass


def download(repo: str, qset: QuantSet, progress: Callable[[str, int, int], None] | None = None,
             verify: Callable[[str, int, int], None] | None = None, cancel: CancelFlag | None = None) -> list[Path]:
    """Every file of ``qset`` into the Hugging Face cache (already there: kept), each checked against the hub's
    SHA-256 (a mismatch removes it and raises); the snapshot paths, in order. Offline (``HF_HUB_OFFLINE``), the
    cached files. ``cancel`` is looked at with each piece the client writes (10 MiB) and while hashing: set, the
    download stops with :class:`~quantscope.core.jobs.Cancelled` and leaves no partial or unchecked new file."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    def report(name: str, done: int, total: int) -> None:
        check_cancel(cancel)
        if progress is not None:
            progress(name, done, total)

    def hashed(name: str, done: int, total: int) -> None:
        check_cancel(cancel)
        if verify is not None:
            verify(name, done, total)

    paths = []
    for f in qset.files:
        check_cancel(cancel)
        had = isinstance(try_to_load_from_cache(repo, f.path), str)
        with hub_errors(repo, f.path):
            path = Path(hf_hub_download(repo, f.path, tqdm_class=_progress_class(report, f.path)))
        if f.sha256:
            try:
                got = sha256_file(path, lambda d, t, n=f.path: hashed(n, d, t))
                check_cancel(cancel)
            except (KeyboardInterrupt, Cancelled):  # stopped before its check: a new download must not look complete
                if not had:
                    _discard(path)
                raise
            if got != f.sha256.lower():
                _discard(path)
                raise HubError(f"{repo}: {f.path}: SHA-256 mismatch (got {got[:16]}…, the hub says "
                               f"{f.sha256[:16]}…): the download was removed; run the command again")
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------ peek
class RemoteGGUF(GGUFFile):
    """A remote GGUF parsed from its first bytes (:func:`peek`): the header as a local file's, and each block
    :meth:`block_bytes` is asked for read from the bytes at hand when the first read holds it, else fetched by a
    ranged read of just its bytes and kept (the last :data:`BLOCK_CACHE` blocks), so a block shown again costs
    nothing. ``blocks_fetched`` / ``bytes_fetched`` count the ranged reads made for blocks."""

    fetch: Callable[[int, int], bytes] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._blocks: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.blocks_fetched = 0
        self.bytes_fetched = 0
        super().__init__(*args, **kwargs)

    def has_block(self, t: Any, row: int, block: int) -> bool:
        """Whether :meth:`block_bytes` answers without a request (in the first read, or fetched before)."""
        off, n = self.block_location(t, row, block)
        if off + n <= self._avail:
            return True
        with self._lock:
            return (off, n) in self._blocks

    def block_bytes(self, t: Any, row: int, block: int) -> bytes:
        off, n = self.block_location(t, row, block)
        if self.fetch is None or off + n <= self._avail:
            return super().block_bytes(t, row, block)
        key = (off, n)
        with self._lock:
            hit = self._blocks.get(key)
            if hit is not None:
                self._blocks.move_to_end(key)
                return hit
        data = self.fetch(off, off + n)  # outside the lock: one slow read does not hold up a cached one
        with self._lock:
            self._blocks[key] = data
            self.blocks_fetched += 1
            self.bytes_fetched += n
            while len(self._blocks) > BLOCK_CACHE:
                self._blocks.popitem(last=False)
        return data


@dataclass
class Peek:
    """A remote GGUF's header, parsed from its first bytes (``fetched`` of ``size``), with the URL its bytes come
    from (for more ranged reads) and where it is on the hub."""

    gguf: RemoteGGUF
    size: int
    fetched: int
    url: str
    headers: dict[str, str]
    repo: str = ""
    filename: str = ""

    @property
    def ref(self) -> str:
        """``hf://org/repo/path`` (what ``quantscope inspect`` takes)."""
        return f"hf://{self.repo}/{self.filename}"


def _read_range(url: str, headers: dict[str, str], start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file at ``url`` by one ranged GET through the client's session; a server that
    ignores the range is read only as far as needed."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    want = end - start
    out = bytearray()
    with get_session().stream("GET", url, headers={**headers, "Range": f"bytes={start}-{end - 1}"},
                              follow_redirects=True) as r:
        hf_raise_for_status(r)
        skip = start if r.status_code == 200 else 0  # no range support: skip to start, stop at end
        for chunk in r.iter_bytes():
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
            out += chunk[: want - len(out)]
            if len(out) >= want:
                break
    if len(out) != want:
        raise HubError(f"the hub sent {len(out)} of the {want} bytes asked for ({start}..{end})")
    return bytes(out)


def _fetch(repo: str, filename: str, url: str, headers: dict[str, str], start: int, end: int) -> bytes:
    with hub_errors(repo, filename):
        return _read_range(url, headers, start, end)


def peek(repo: str, filename: str, first: int = PEEK_FIRST, limit: int = PEEK_LIMIT) -> Peek:
    """Parse a remote GGUF's header without downloading the file: fetch its first ``first`` bytes, and more (what the
    parser says it needs, at least twice as much) while the header goes on, up to ``limit``. The header is checked
    as a local file's is (a :class:`GGUFError` for a hostile one)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, filename)
    with hub_errors(repo, filename):
        meta = get_hf_file_metadata(url)
        if meta.size is None:
            raise HubError(f"{repo}: {filename}: the hub did not say how large it is")
        size = meta.size
        location = meta.location or url
        same = location == url or location.startswith(_endpoint())
        headers = build_hf_headers() if same else {}
        headers["Accept-Encoding"] = "identity"
        data = b""
        ask = min(first, size)
        while True:
            if ask > len(data):
                data += _read_range(location, headers, len(data), ask)
            try:
                f = RemoteGGUF(data, strict=False, file_size=size)
                f.fetch = lambda a, b: _fetch(repo, filename, location, headers, a, b)
                return Peek(f, size, len(data), location, headers, repo, filename)
            except NeedMoreBytes as exc:
                if len(data) >= limit:
                    raise GGUFError(f"the header is longer than the {len(data):,} bytes read (of {size:,})",
                                    exc.offset) from None
                ask = min(max(exc.needed or 0, 2 * len(data)), limit, size)


# ------------------------------------------------------------------------------------------------ fit
def fit_text(need: int, room: int | None) -> str:
    """``fits`` / ``tight`` / ``too large`` for ``need`` bytes against ``room`` (unknown: ``?``)."""
    if room is None:
        return "?"
    if need <= room * 0.8:
        return "fits"
    if need <= room:
        return "tight"
    return "too large"
