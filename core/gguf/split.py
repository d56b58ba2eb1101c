"""Split a GGUF model into shards and merge shards back, byte for byte like llama-gguf-split (docs/shards.md).

:func:`split_gguf` is ``llama-gguf-split --split`` (``--split-max-tensors N`` or ``--split-max-size N(M|G)``,
``--no-tensor-first-split``, ``--dry-run``); :func:`merge_gguf` is ``--merge``. The output files match the tool's:

* every shard is GGUF version 3 with its data aligned to 32 bytes; each tensor's bytes are followed by zeros up to
  the next multiple of 32 (the last one too);
* the first shard carries the input's metadata in its order with the ``split.*`` keys removed, then ``split.no``
  (u16), ``split.tensors.count`` (i32) and ``split.count`` (u16); the others carry only those three keys;
* tensor infos list ggml's dimension count (trailing 1s dropped); offsets run from 0 within each shard;
* the merged file carries the first shard's metadata with ``split.count`` moved to the end and set to 0 (what
  keeps llama.cpp from treating it as a shard), then every shard's tensors in order.

Every output set is written to temporaries and renamed into place together only once all of it is written
(:class:`~quantscope.core.fsutil.OutputSet`); a failure, a cancel or a kill leaves nothing, and no output may be
one of the input files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import sysinfo
from ..base.gguf_constants import DEFAULT_ALIGNMENT, ValueType
from ..fsutil import OutputSet
from ..jobs import CancelFlag, check_cancel
from ..shardnames import shard_path
from .reader import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT, GGUFFile, TensorInfo
from .writer import DataSection, GGUFHeader, encode_entry, ggml_dims, pad_to

#: what llama-gguf-split writes: version 3, data aligned to GGUF_DEFAULT_ALIGNMENT
OUT_VERSION = 3
ALIGN = DEFAULT_ALIGNMENT
#: tensor bytes are copied in pieces of at most this size (resident memory stays near it)
CHUNK = 16 << 20
_SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)
_INT_MAX = (1 << 31) - 1
_SIZE_RE = re.compile(r"(\d+)([MG])")


class SplitError(ValueError):
    """The model cannot be split or merged as asked; the message says why (and names the file)."""


@dataclass(frozen=True)
class ShardPlan:
    """One output file: its path, the tensors it holds, its header and its size."""

    index: int
    path: Path
    tensors: tuple[TensorInfo, ...]
    header: bytes
    size: int

    @property
    def tensor_bytes(self) -> int:
        """The tensors' bytes without padding (what llama-gguf-split's plan adds to the header size)."""
        return sum(t.n_bytes or 0 for t in self.tensors)


@dataclass(frozen=True)
class SplitPlan:
    """The files a split (or merge: one file) writes, in order."""

    shards: tuple[ShardPlan, ...]
    n_tensors: int

    @property
    def total_size(self) -> int:
        return sum(s.size for s in self.shards)

    def report(self) -> list[str]:
        """llama-gguf-split's plan lines (``n_split: 3``, ``split 00001: n_tensors = 5, total_size = 12M``; sizes
        in whole megabytes of the header plus the unpadded tensor bytes)."""
        out = [f"n_split: {len(self.shards)}"]
        for s in self.shards:
            mb = (len(s.header) + s.tensor_bytes) // 1000 // 1000
            out.append(f"split {s.index + 1:05d}: n_tensors = {len(s.tensors)}, total_size = {mb}M")
        return out


def parse_size(text: str) -> int:
    """``--split-max-size``: a whole number of megabytes (``M``, 10^6 bytes) or gigabytes (``G``, 10^9) -> bytes.

    llama-gguf-split reads the number with ``sscanf("%d")`` and so takes ``1.5G`` as 1 GB; here anything but
    digits and one unit letter is refused."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        unit = text.strip()[-1:] or "nothing"
        if unit not in ("M", "G"):
            raise SplitError(f"split size {text!r}: the supported units are M (megabytes) and G (gigabytes), "
                             f"got {unit!r}")
        raise SplitError(f"split size {text!r}: expected a whole number and its unit, e.g. 500M or 2G")
    n = int(m.group(1))
    if not 0 < n <= _INT_MAX:
        raise SplitError(f"split size {text!r}: the number must be 1..{_INT_MAX}")
    return n * (1000**2 if m.group(2) == "M" else 1000**3)


def _pad(n: int, a: int = ALIGN) -> int:
    return pad_to(n, a)


def _kv_u16(key: str, v: int) -> bytes:
    return encode_entry(key, ValueType.UINT16, v)


def _kv_i32(key: str, v: int) -> bytes:
    return encode_entry(key, ValueType.INT32, v)


def _header(kvs: list[bytes], tensors: Sequence[TensorInfo]) -> bytes:
    header = GGUFHeader(ALIGN, OUT_VERSION)
    for kv in kvs:
        header.add_raw(kv)
    for t in tensors:
        header.add_tensor(t.name, ggml_dims(t.ne), t.type_id, t.n_bytes or 0)
    return header.encode()


def _shard(index: int, path: Path, tensors: list[TensorInfo], kvs: list[bytes]) -> ShardPlan:
    header = _header(kvs, tensors)
    return ShardPlan(index, path, tuple(tensors), header, len(header) + sum(_pad(t.n_bytes or 0) for t in tensors))


def _check_input(f: GGUFFile, what: str) -> None:
    """Refuse what llama-gguf-split cannot write correctly: unreadable tensors, another alignment."""
    name = f.path.name if f.path is not None else "the input"
    odd = next((s for s in f.shards if s.alignment != ALIGN), None)
    if odd is not None:
        where = odd.path.name if odd.path is not None else name
        raise SplitError(f"{where}: general.alignment is {odd.alignment}; llama-gguf-split writes every {what} "
                         f"aligned to {ALIGN} bytes but would keep the key, making a broken file")
    for t in f.tensors:
        if t.problem is not None or t.n_bytes is None:
            raise SplitError(f"{name}: tensor {t.name!r} cannot be copied: {t.problem or t.type_name}")
    if len(f.tensors) > _INT_MAX:
        raise SplitError(f"{name}: {len(f.tensors)} tensors do not fit split.tensors.count")


def plan_split(f: GGUFFile, out_prefix: str | os.PathLike[str], *, max_tensors: int | None = None,
               max_size: int | None = None, no_tensor_first_split: bool = False) -> SplitPlan:
    """Decide the shards like llama-gguf-split: a new shard before tensor ``i`` when ``i`` is a positive multiple
    of ``max_tensors`` (default 128), or when the tensors so far plus this one (each padded to 32 bytes) would
    exceed ``max_size`` bytes (the metadata is not counted)."""
    if max_tensors is not None and max_size is not None:
        raise SplitError("give either a maximum tensor count or a maximum size per shard, not both")
    if max_size is None:
        max_tensors = 128 if max_tensors is None else max_tensors
        if not 0 < max_tensors <= _INT_MAX:
            raise SplitError(f"the maximum tensors per shard must be 1..{_INT_MAX}, not {max_tensors}")
    elif max_size <= 0:
        raise SplitError(f"the maximum shard size must be positive, not {max_size}")
    _check_input(f, "shard")
    n = len(f.tensors)
    groups: list[list[TensorInfo]] = [[]]
    if no_tensor_first_split:
        groups.append([])
    cur = 0
    for i, t in enumerate(f.tensors):
        size = _pad(t.n_bytes or 0)
        if max_size is not None:
            split = cur + size > max_size
        else:
            assert max_tensors is not None
            split = i > 0 and i % max_tensors == 0
        if split:
            if not groups[-1]:
                raise SplitError(f"tensor {t.name!r} ({size:,} bytes padded) alone exceeds the maximum shard size "
                                 f"of {max_size:,} bytes: a shard would hold no tensors (llama-gguf-split refuses "
                                 "too)")
            groups.append([])
            cur = size
        else:
            cur += size
        groups[-1].append(t)
    count = len(groups)
    if count > 0xFFFF:
        raise SplitError(f"{count} shards: split.count holds at most 65535")
    first_kvs = [f.entry_bytes(k) for k in f.metadata if k not in _SPLIT_KEYS]
    shards = []
    for i, tensors in enumerate(groups):
        kvs = (first_kvs if i == 0 else []) + [_kv_u16(SPLIT_NO, i), _kv_i32(SPLIT_TENSORS_COUNT, n),
                                               _kv_u16(SPLIT_COUNT, count)]
        shards.append(_shard(i, shard_path(out_prefix, i, count), tensors, kvs))
    return SplitPlan(tuple(shards), n)


def plan_merge(f: GGUFFile, out: str | os.PathLike[str]) -> SplitPlan:
    """The one file ``--merge`` writes from the split model ``f`` (opened from any of its shards)."""
    name = f.path.name if f.path is not None else "the input"
    count = f.get(SPLIT_COUNT)
    if not f.is_split and count != 1:
        raise SplitError(f"{name} is not a shard of a split model (split.count is "
                         f"{'missing' if count is None else count})")
    _check_input(f, "file")
    kvs = [f.entry_bytes(k) for k in f.metadata if k != SPLIT_COUNT] + [_kv_u16(SPLIT_COUNT, 0)]
    return SplitPlan((_shard(0, Path(out), list(f.tensors), kvs),), len(f.tensors))


def write_plan(f: GGUFFile, plan: SplitPlan, *, progress: Callable[[int, int], None] | None = None,
               cancel: CancelFlag | None = None) -> list[Path]:
    """Write every file of ``plan`` (tensor bytes copied from ``f`` under the fault guard), renamed into place
    together when all are complete; returns their paths. Raises :class:`~quantscope.core.jobs.Cancelled` (nothing
    is left behind) or :class:`~quantscope.core.fsutil.PathRefused` (an output is an input or not a file)."""
    import numpy as np

    from ..native import kernels as K

    _enough_descriptors(len(plan.shards) + len(f.shards))
    total = plan.total_size
    done = 0
    buf = np.empty(0, np.uint8)
    labels = [f"shard {s.index + 1}" if len(plan.shards) > 1 else "output" for s in plan.shards]
    with OutputSet(list(zip(labels, (s.path for s in plan.shards), strict=True)), inputs=f.paths) as outs:
        for label in labels:  # every temporary first: a bad folder fails before any copying
            outs.open(label)
        for label, s in zip(labels, plan.shards, strict=True):
            check_cancel(cancel)
            outs.write_bytes(label, s.header)
            done += len(s.header)
            data = DataSection(lambda b, lb=label: outs.write_bytes(lb, b), ALIGN, (t.n_bytes or 0 for t in s.tensors))
            for t in s.tensors:
                n = t.n_bytes or 0
                src = f.tensor_bytes(t)
                for a in range(0, n, CHUNK):
                    check_cancel(cancel)
                    b = min(n, a + CHUNK)
                    if buf.size < b - a:
                        buf = np.empty(min(n, CHUNK), np.uint8)
                    data.write(K.copy_mapped(src[a:b], f"tensor {t.name}", out=buf[: b - a]).data)
                    f.release_pages(t.data_offset + a, b - a, shard=t.shard)  # resident memory: about one chunk
                    done += b - a
                    if progress is not None:
                        progress(done, total)
                del src
                f.release_pages(t.data_offset, n, shard=t.shard)  # the pages the chunks' edges shared
                done += data.end_tensor()
            data.finish()
            if progress is not None:
                progress(done, total)
        check_cancel(cancel)
        outs.commit()
        return [outs.target(label) for label in labels]


def _enough_descriptors(n: int) -> None:
    """Every output's temporary stays open until all are renamed together: raise the soft limit on open files
    when ``n`` more would not fit (up to the hard limit), or refuse before writing anything."""
    soft, hard = sysinfo.open_fd_limits()
    need = n + 256  # what the process already holds, roughly
    if soft is None or need <= soft:
        return
    if (hard is not None and need > hard) or not sysinfo.raise_open_fd_limit(need):
        allowed = f" ({hard:,})" if hard is not None else ""
        raise SplitError(f"{n:,} files would be open at once, more than this system allows{allowed}; use a "
                         "larger limit per shard")


def split_gguf(src: str | os.PathLike[str], out_prefix: str | os.PathLike[str], *, max_tensors: int | None = None,
               max_size: int | None = None, no_tensor_first_split: bool = False, dry_run: bool = False,
               progress: Callable[[int, int], None] | None = None, cancel: CancelFlag | None = None) -> SplitPlan:
    """``llama-gguf-split --split``: write ``src`` (a file, or a split model opened from any shard) as shards
    ``OUT_PREFIX-00001-of-0000N.gguf`` …; ``dry_run`` only plans. Returns the plan (paths, tensors, sizes)."""
    with GGUFFile(src) as f:
        plan = plan_split(f, out_prefix, max_tensors=max_tensors, max_size=max_size,
                          no_tensor_first_split=no_tensor_first_split)
        if not dry_run:
            write_plan(f, plan, progress=progress, cancel=cancel)
        return plan


def merge_gguf(first_shard: str | os.PathLike[str], out: str | os.PathLike[str], *, dry_run: bool = False,
               progress: Callable[[int, int], None] | None = None, cancel: CancelFlag | None = None) -> SplitPlan:
    """``llama-gguf-split --merge``: write the split model ``first_shard`` belongs to (any of its shards may be
    given) as the one file ``out``. Returns the plan."""
    with GGUFFile(first_shard) as f:
        plan = plan_merge(f, out)
        if not dry_run:
            write_plan(f, plan, progress=progress, cancel=cancel)
        return plan

