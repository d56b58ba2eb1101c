"""The library: every GGUF already on this machine, found where the usual tools keep them (the Hugging Face cache,
LM Studio, Ollama, llama.cpp's cache, GPT4All) and in folders the user adds, each read from its header only.

Nothing is copied or modified: a row's ``path`` is the file as the tool stores it (an Ollama blob, a Hugging Face
snapshot link), opened read-only. A scan keeps what it read in a cache keyed by path, size and modification time, so
a rescan reads only new or changed files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .fsutil import write_atomic
from .shardnames import sibling_shards
from .sysinfo import tool_folders, user_cache_dir, user_data_dir

#: the stores, in the order the library lists them
KINDS = ("hf", "lmstudio", "ollama", "llama.cpp", "gpt4all", "folder")
LABELS = {"hf": "Hugging Face cache", "lmstudio": "LM Studio", "ollama": "Ollama", "llama.cpp": "llama.cpp cache",
          "gpt4all": "GPT4All", "folder": "folder"}
#: a folder walk stops this deep and after this many files (a home folder added by mistake stays quick)
MAX_DEPTH = 8
MAX_FILES = 20000
#: an Ollama manifest larger than this is not one
MAX_MANIFEST_BYTES = 1 << 20
CACHE_VERSION = 2  # (a new version when a row's fields or their meaning change: old rows are read again)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


class LibraryError(ValueError):
    """A folder that cannot be added, or a library settings file that cannot be read."""


@dataclass(frozen=True)
class Store:
    """One place GGUFs are kept: ``kind`` (one of :data:`KINDS`) and its root folder."""

    kind: str
    root: Path

    @property
    def label(self) -> str:
        return LABELS[self.kind]


@dataclass
class Entry:
    """One model: a file, or a split set listed once by its first shard. ``name`` is the store's own name for it
    (``org/repo/file.gguf``, Ollama's ``name:tag``); ``size`` counts every shard; ``problem`` says why the header
    could not be read (the other header fields are then None)."""

    name: str
    source: str
    path: str
    store: str
    size: int = 0
    shards: int = 1
    architecture: str | None = None
    parameters: int | None = None
    file_type: str | None = None
    model_name: str | None = None
    problem: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------ where they are
def store_places(env: Mapping[str, str] = os.environ) -> list[Store]:
    """Every place the usual tools keep models on this system, existing or not (core/sysinfo.py's
    :func:`~quantscope.core.sysinfo.tool_folders`), with the tools' own overrides: ``HF_HUB_CACHE`` (else
    ``HF_HOME/hub``), ``OLLAMA_MODELS``, ``LLAMA_CACHE``."""
    places = tool_folders()
    if env.get("HF_HUB_CACHE"):
        places["hf"] = [Path(env["HF_HUB_CACHE"]).expanduser()]
    elif env.get("HF_HOME"):
        places["hf"] = [Path(env["HF_HOME"]).expanduser() / "hub"]
    if env.get("OLLAMA_MODELS"):
        places["ollama"] = [Path(env["OLLAMA_MODELS"]).expanduser()]
    if env.get("LLAMA_CACHE"):
        places["llama.cpp"] = [Path(env["LLAMA_CACHE"]).expanduser()]
    return [Store(kind, root) for kind in KINDS for root in places.get(kind, [])]


def settings_path() -> Path:
    """The user's library settings (the folders they added)."""
    return user_data_dir() / "quantscope" / "library.json"


def cache_path() -> Path:
    """What the last scan read, by path (re-creatable)."""
    return user_cache_dir() / "quantscope" / "library-scan.json"


def user_folders(settings: Path | None = None) -> list[Path]:
    """The folders the user added (none when the settings file is absent)."""
    p = settings or settings_path()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise LibraryError(f"{p}: not a library settings file ({exc})") from None
    folders = data.get("folders") if isinstance(data, dict) else None
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        raise LibraryError(f"{p}: 'folders' is not a list of paths")
    return [Path(f) for f in folders]


def set_user_folders(folders: Iterable[Path], settings: Path | None = None) -> None:
    p = settings or settings_path()
    text = json.dumps({"folders": [str(f) for f in folders]}, indent=1) + "\n"
    write_atomic(p, text, "library settings", make_dirs=True)


def add_folder(folder: str | os.PathLike[str], settings: Path | None = None) -> Path:
    """Add ``folder`` (an existing directory, kept as an absolute path) to the user's folders."""
    f = Path(folder).expanduser().resolve()
    if not f.is_dir():
        raise LibraryError(f"{folder}: not a folder")
    have = user_folders(settings)
    if f not in have:
        set_user_folders([*have, f], settings)
    return f


def remove_folder(folder: str | os.PathLike[str], settings: Path | None = None) -> bool:
    """Take ``folder`` out of the user's folders; False when it was not one."""
    f = Path(folder).expanduser().resolve()
    have = user_folders(settings)
    if f not in have:
        return False
    set_user_folders([x for x in have if x != f], settings)
    return True


def stores(folders: Iterable[Path] | None = None, env: Mapping[str, str] = os.environ) -> list[Store]:
    """The places to scan that exist: the tools' (:func:`store_places`) and the user's folders."""
    extra = list(user_folders()) if folders is None else list(folders)
    seen: set[Path] = set()
    out = []
    for s in [*store_places(env), *(Store("folder", Path(f)) for f in extra)]:
        try:
            key = s.root.resolve()
        except OSError:
            continue
        if key in seen or not s.root.is_dir():
            continue
        seen.add(key)
        out.append(s)
    return out


# ------------------------------------------------------------------------------------------ the files of a store
@dataclass(frozen=True)
class Candidate:
    """A file a store holds, with the store's name for it."""

    path: Path
    name: str
    store: Store


def _is_later_shard(name: str) -> bool:
    m = _SHARD.search(name)
    return m is not None and int(m.group(1)) != 1


def _walk(store: Store, prefix: str = "") -> Iterator[Candidate]:
    """``*.gguf`` under the store's root (not following links out of it, at most :data:`MAX_DEPTH` deep, hidden
    folders skipped), later shards of a set left to their first."""
    root = store.root
    n = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if depth < MAX_DEPTH else []
        for fn in sorted(filenames):
            if not fn.lower().endswith(".gguf") or _is_later_shard(fn):
                continue
            p = Path(dirpath) / fn
            n += 1
            if n > MAX_FILES:
                return
            yield Candidate(p, prefix + p.relative_to(root).as_posix(), store)


def _hf_files(store: Store) -> Iterator[Candidate]:
    """The cache's GGUFs through ``huggingface_hub``'s own scan: ``org/repo/file.gguf`` per snapshot file (each blob
    once, the newest revision's name)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(store.root)
    except (CacheNotFound, OSError, ValueError):  # a cache it cannot read lists nothing
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        blobs: set[Path] = set()
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for f in sorted(rev.files, key=lambda f: str(f.file_path)):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if not rel.lower().endswith(".gguf") or _is_later_shard(rel) or f.blob_path in blobs:
                    continue
                blobs.add(f.blob_path)
                yield Candidate(f.file_path, f"{repo.repo_id}/{rel}", store)


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    if host == "registry.ollama.ai":
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama_files(store: Store) -> Iterator[Candidate]:
    """Ollama's manifests (``manifests/HOST/NAMESPACE/MODEL/TAG``, JSON): each one's model layer
    (``application/vnd.ollama.image.model``) is a GGUF blob ``blobs/sha256-HEX``, named ``model:tag``. A manifest
    that is not one, or whose digest is not a sha256, is skipped."""
    root = store.root
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for path in sorted(manifests.glob("*/*/*/*")):
        try:
            if not path.is_file() or path.stat().st_size > MAX_MANIFEST_BYTES:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        layers = data.get("layers") if isinstance(data, dict) else None
        if not isinstance(layers, list):
            continue
        for layer in layers:
            if not isinstance(layer, dict) or layer.get("mediaType") != "application/vnd.ollama.image.model":
                continue
            m = _DIGEST.fullmatch(str(layer.get("digest", "")))
            if m is None:
                continue
            blob = next((b for b in (root / "blobs" / f"sha256-{m.group(1)}", root / "blobs" / f"sha256:{m.group(1)}")
                         if b.is_file()), None)
            if blob is not None:
                host, namespace, model, tag = path.relative_to(manifests).parts
                yield Candidate(blob, _ollama_name(host, namespace, model, tag), store)


def candidates(store: Store) -> Iterator[Candidate]:
    """The files ``store`` holds, as its tool names them."""
    if store.kind == "hf":
        yield from _hf_files(store)
    elif store.kind == "ollama":
        yield from _ollama_files(store)
    else:
        yield from _walk(store)


# ------------------------------------------------------------------------------------------------- the headers
def read_entry(c: Candidate) -> Entry:
    """``c``'s row, from its header only (a split set: the first shard's header, every shard's size)."""
    from .gguf.errors import GGUFError
    from .gguf.reader import GGUFFile

    e = Entry(name=c.name, source=c.store.kind, path=str(c.path), store=str(c.store.root))
    shards = sibling_shards(c.path) if _SHARD.search(c.path.name) else [c.path]
    try:
        e.size = sum(p.stat().st_size for p in shards)
    except OSError as exc:
        e.problem = f"shard missing: {exc.strerror or exc}"
        e.size = c.path.stat().st_size if c.path.exists() else 0
    e.shards = len(shards)
    try:
        with GGUFFile(c.path, strict=False) as f:
            e.architecture = f.architecture
            e.parameters = sum(t.n_elements for t in f.tensors)
            ft = f.file_type_name  # llama.cpp's LLAMA_FTYPE_ names, shown as their quantization: Q4_K_M, F16
            e.file_type = ft.removeprefix("MOSTLY_").removeprefix("ALL_") if ft else _main_type(f.tensors)
            name = f.get("general.name")
            e.model_name = name if isinstance(name, str) else None
            if f.problems and e.problem is None:
                e.problem = str(f.problems[0])
    except (GGUFError, OSError, ValueError, OverflowError) as exc:  # an unreadable header: a row with its reason
        e.problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return e


def _main_type(tensors: Iterable[Any]) -> str | None:
    """The type holding most of the tensor bytes (a file without ``general.file_type``)."""
    by: dict[str, int] = {}
    for t in tensors:
        by[t.type_name] = by.get(t.type_name, 0) + (t.n_bytes or 0)
    return max(by, key=lambda k: by[k]) if by else None


def _fingerprint(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


def scan(places: Iterable[Store] | None = None, *, cache: Path | None = None,
         progress: Callable[[int, str], None] | None = None,
         cancelled: Callable[[], bool] | None = None) -> list[Entry]:
    """Every model in ``places`` (default :func:`stores`), sorted by store then name. Headers are read only for files
    whose size, modification time or inode changed since the scan recorded in ``cache`` (default
    :func:`cache_path`; the cache is rewritten when anything changed). ``progress(n, name)`` after each file;
    ``cancelled()`` true stops the scan (what was read so far is returned and cached)."""
    cache_file = cache or cache_path()
    old = _load_cache(cache_file)
    new: dict[str, Any] = {}
    out: list[Entry] = []
    dirty = False
    for store in stores() if places is None else places:
        for c in candidates(store):
            if cancelled is not None and cancelled():
                break
            key = str(c.path)
            fp = _fingerprint(c.path)
            rec = old.get(key)
            row = rec.get("row") if isinstance(rec, dict) and rec.get("fp") == fp else None
            if isinstance(row, dict) and set(row) == set(Entry.__dataclass_fields__):
                e = Entry(**row)
                e.name, e.source, e.store = c.name, store.kind, str(store.root)
            else:
                e = read_entry(c)
                dirty = True
            new[key] = {"fp": fp, "row": e.to_json()}
            out.append(e)
            if progress is not None:
                progress(len(out), c.name)
    if dirty or set(new) != set(old):
        try:
            write_atomic(cache_file, json.dumps({"version": CACHE_VERSION, "files": new}), "library cache",
                         make_dirs=True)
        except OSError:
            pass  # a cache that cannot be written only costs the next scan time
    order = {k: i for i, k in enumerate(KINDS)}
    out.sort(key=lambda e: (order.get(e.source, len(KINDS)), e.name.lower()))
    return out
