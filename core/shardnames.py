"""llama.cpp's names for the files of a split model (``PREFIX-00002-of-00003.gguf``), computed from names alone.

A bottom-level module: the reader uses it to find a set's shards, and the writers' output checks (fsutil) use it to
refuse every shard an input's name implies, without either importing the other.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def shard_path(prefix: str | os.PathLike[str], index: int, count: int) -> Path:
    """llama.cpp's name of shard ``index`` (0-based) of ``count``: ``PREFIX-00001-of-00003.gguf``."""
    return Path(f"{os.fspath(prefix)}-{index + 1:05d}-of-{count:05d}.gguf")


def shard_prefix(path: str | os.PathLike[str], index: int, count: int) -> str | None:
    """The prefix ``path`` was named from as shard ``index`` of ``count``, or ``None`` when its name does not end in
    ``-{index+1:05d}-of-{count:05d}.gguf`` (after a non-empty prefix), as llama.cpp requires to find the others."""
    text = os.fspath(path)
    suffix = f"-{index + 1:05d}-of-{count:05d}.gguf"
    if len(text) <= len(suffix) or not text.endswith(suffix):
        return None
    return text[: -len(suffix)]


def sibling_shards(path: str | os.PathLike[str]) -> list[Path]:
    """Every file of the set ``path``'s name says it belongs to (``[path]`` for any other name), without opening
    anything: what a writer must not overwrite when ``path`` is its input."""
    text = os.fspath(path)
    m = _SHARD_NAME.search(text)
    if m is None or m.start() == 0:
        return [Path(path)]
    no, count = int(m.group(1)), int(m.group(2))
    if not 1 <= no <= count:
        return [Path(path)]
    return [shard_path(text[: m.start()], i, count) for i in range(count)]
