"""Facts about this machine and process that each OS tells differently: memory (total, available), open file
descriptors (count, limit), resident set size (now, peak) and whether a process runs. The one place with
``/proc``, ``resource``, ``sysctl``/``vm_stat`` and the Win32 calls for these; every branch is per OS:

- Linux: ``/proc/meminfo`` (within a cgroup v2 limit), ``/proc/self/fd``, ``/proc/<pid>/status``, ``resource``.
- macOS: ``sysctl hw.memsize``, ``vm_stat``, ``/dev/fd``, ``ps``, ``resource`` (``ru_maxrss`` in bytes).
- Windows: ``GlobalMemoryStatusEx``, ``GetProcessMemoryInfo``, ``OpenProcess`` through ctypes; there is no
  count of open descriptors (None), and the C runtime's fixed cap of 8,192 low-level descriptors is the limit.
- Other POSIX systems: ``os.sysconf`` and ``resource`` where they exist.

Every function answers None (or 0 for the RSS figures, as their callers print them) where the OS does not say."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

LINUX = sys.platform.startswith("linux")
MACOS = sys.platform == "darwin"
WINDOWS = sys.platform == "win32"

#: the Windows C runtime's cap on low-level descriptors (``_open``, hence ``os.open``): fixed, not configurable
WINDOWS_CRT_MAX_FDS = 8192


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


# ------------------------------------------------------------------------------------------------------ memory
def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo``'s fields in bytes (``{"MemTotal": …, "MemAvailable": …}``); counts without a unit as
    they are."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            n = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = n * 1024 if parts[1:2] == ["kB"] else n
    return out


_VM_PAGE = re.compile(r"page size of (\d+) bytes")


def parse_vm_stat(text: str) -> int | None:
    """Bytes available in macOS ``vm_stat`` output: free, inactive and speculative pages (what can be had without
    swapping), times the page size of its first line; None when the text has no such figures."""
    m = _VM_PAGE.search(text)
    if m is None:
        return None
    pages: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and rest.strip().rstrip(".").isdigit():
            pages[key.strip()] = int(rest.strip().rstrip("."))
    wanted = ("Pages free", "Pages inactive", "Pages speculative")
    if not any(k in pages for k in wanted):
        return None
    return sum(pages.get(k, 0) for k in wanted) * int(m.group(1))


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_room() -> int | None:
    """Linux: bytes this process's cgroup (v2, ``/sys/fs/cgroup``) still allows, None without a limit; None
    elsewhere."""
    if not LINUX:
        return None
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    return max(0, limit - used) if limit is not None and used is not None else None


class MemoryStatusEx(ctypes.Structure):
    """Win32 ``MEMORYSTATUSEX`` (64 bytes)."""

    _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                ("ullTotalPhys", ctypes.c_uint64), ("ullAvailPhys", ctypes.c_uint64),
                ("ullTotalPageFile", ctypes.c_uint64), ("ullAvailPageFile", ctypes.c_uint64),
                ("ullTotalVirtual", ctypes.c_uint64), ("ullAvailVirtual", ctypes.c_uint64),
                ("ullAvailExtendedVirtual", ctypes.c_uint64)]


class ProcessMemoryCounters(ctypes.Structure):
    """Win32 ``PROCESS_MEMORY_COUNTERS`` (72 bytes on 64-bit Windows)."""

    _fields_ = [("cb", ctypes.c_uint32), ("PageFaultCount", ctypes.c_uint32),
                ("PeakWorkingSetSize", ctypes.c_size_t), ("WorkingSetSize", ctypes.c_size_t),
                ("QuotaPeakPagedPoolUsage", ctypes.c_size_t), ("QuotaPagedPoolUsage", ctypes.c_size_t),
                ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t), ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
                ("PagefileUsage", ctypes.c_size_t), ("PeakPagefileUsage", ctypes.c_size_t)]


def _kernel32() -> ctypes.CDLL:
    """Windows: kernel32, its calls' error codes kept for :func:`ctypes.get_last_error`."""
    if not WINDOWS:
        raise OSError("kernel32 exists on Windows only")
    k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    k32.GetCurrentProcess.restype = ctypes.c_void_p
    k32.OpenProcess.restype = ctypes.c_void_p
    k32.OpenProcess.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32]
    k32.GetExitCodeProcess.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    k32.CloseHandle.argtypes = [ctypes.c_void_p]
    k32.K32GetProcessMemoryInfo.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32]
    return k32


def _windows_memory() -> tuple[int, int] | None:
    """Windows: (total, available) physical memory from ``GlobalMemoryStatusEx``."""
    if not WINDOWS:
        return None
    st = MemoryStatusEx()
    st.dwLength = ctypes.sizeof(MemoryStatusEx)
    if not _kernel32().GlobalMemoryStatusEx(ctypes.byref(st)):
        return None
    return int(st.ullTotalPhys), int(st.ullAvailPhys)


def _sysconf_pages(name: str) -> int | None:
    """``os.sysconf(name)`` pages in bytes (POSIX systems that have the name), else None."""
    if not hasattr(os, "sysconf"):
        return None
    try:
        n = int(os.sysconf(name)) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return None
    return n if n > 0 else None


def memory_total() -> int | None:
    """Bytes of physical memory, None when unknown."""
    if LINUX:
        try:
            total = parse_meminfo(Path("/proc/meminfo").read_text(encoding="ascii", errors="replace")).get(
                "MemTotal")
        except OSError:
            total = None
        return total or _sysconf_pages("SC_PHYS_PAGES")
    if MACOS:
        try:
            return int(_run("sysctl", "-n", "hw.memsize").strip()) or None
        except ValueError:
            return None
    if WINDOWS:
        mem = _windows_memory()
        return mem[0] if mem else None
    return _sysconf_pages("SC_PHYS_PAGES")


def memory_available() -> int | None:
    """Bytes of memory that can be had now without swapping (Linux ``MemAvailable`` within the cgroup's limit,
    macOS ``vm_stat``'s free + inactive + speculative pages, Windows ``ullAvailPhys``), None when unknown."""
    avail: int | None = None
    if LINUX:
        try:
            avail = parse_meminfo(Path("/proc/meminfo").read_text(encoding="ascii", errors="replace")).get(
                "MemAvailable")
        except OSError:
            avail = None
        if avail is None:
            avail = _sysconf_pages("SC_AVPHYS_PAGES")
        room = cgroup_room()
        if avail is not None and room is not None:
            avail = min(avail, room)
    elif MACOS:
        avail = parse_vm_stat(_run("vm_stat"))
    elif WINDOWS:
        mem = _windows_memory()
        avail = mem[1] if mem else None
    else:
        avail = _sysconf_pages("SC_AVPHYS_PAGES")
    return avail if avail is not None and avail > 0 else None


# ---------------------------------------------------------------------------------------------- descriptors
def open_fd_count() -> int | None:
    """About how many file descriptors this process holds (Linux ``/proc/self/fd``, macOS ``/dev/fd``); None
    where no OS call tells (Windows)."""
    if LINUX:
        folder = "/proc/self/fd"
    elif MACOS:
        folder = "/dev/fd"
    else:
        return None
    try:
        return len(os.listdir(folder))
    except OSError:
        return None


def open_fd_limits() -> tuple[int | None, int | None]:
    """(soft, hard) limit on this process's open file descriptors, None for unlimited or unknown: POSIX
    ``RLIMIT_NOFILE``; Windows the C runtime's fixed :data:`WINDOWS_CRT_MAX_FDS` (both)."""
    if WINDOWS:
        return WINDOWS_CRT_MAX_FDS, WINDOWS_CRT_MAX_FDS
    try:
        import resource
    except ImportError:
        return None, None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None, None
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else int(soft)), (None if hard == inf else int(hard))


def raise_open_fd_limit(soft: int) -> bool:
    """Raise the soft limit on open descriptors to ``soft`` (POSIX, at most the hard limit); whether it is now at
    least that. Windows: whether ``soft`` is within the C runtime's fixed cap."""
    if WINDOWS:
        return soft <= WINDOWS_CRT_MAX_FDS
    try:
        import resource
    except ImportError:
        return False
    try:
        _old, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (OSError, ValueError):  # above the hard limit, or macOS's kern.maxfilesperproc
        return False
    return True


# ---------------------------------------------------------------------------------------------------- RSS
def _windows_process_memory() -> tuple[int, int] | None:
    """Windows: (working set, peak working set) of this process from ``GetProcessMemoryInfo``."""
    if not WINDOWS:
        return None
    c = ProcessMemoryCounters()
    c.cb = ctypes.sizeof(ProcessMemoryCounters)
    k32 = _kernel32()
    if not k32.K32GetProcessMemoryInfo(k32.GetCurrentProcess(), ctypes.byref(c), c.cb):
        return None
    return int(c.WorkingSetSize), int(c.PeakWorkingSetSize)


def rss_bytes() -> int:
    """Current resident set size of this process (Linux ``/proc/self/statm``, macOS ``ps``, Windows the working
    set); 0 when unknown."""
    try:
        if LINUX:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * int(os.sysconf("SC_PAGE_SIZE"))
        if MACOS:
            return int(_run("ps", "-o", "rss=", "-p", str(os.getpid())).strip() or 0) * 1024
        if WINDOWS:
            mem = _windows_process_memory()
            return mem[0] if mem else 0
    except (OSError, ValueError, IndexError):
        pass
    return 0


def maxrss_bytes(ru_maxrss: int) -> int:
    """A ``ru_maxrss`` (getrusage, wait4) in bytes: macOS counts bytes, Linux and the BSDs KiB."""
    return ru_maxrss if MACOS else ru_maxrss * 1024


def peak_rss_bytes(pid: int | str = "self") -> int:
    """Peak resident set size of a process since its exec (0 when unknown or gone). Linux: ``VmHWM`` of
    ``/proc/<pid>/status`` (not ``ru_maxrss``: Linux carries that across fork and exec, so a child of a large
    process reports the parent's size). Elsewhere only this process's own: ``ru_maxrss`` (macOS, BSD), the peak
    working set (Windows); 0 for another process."""
    if LINUX:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    if pid != "self" and pid != os.getpid():
        return 0
    if WINDOWS:
        mem = _windows_process_memory()
        return mem[1] if mem else 0
    try:
        import resource
    except ImportError:
        return 0
    return maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS counter so that :func:`peak_rss_bytes` measures from now (Linux >= 4.0,
    ``/proc/self/clear_refs``); False where the OS has no such reset."""
    if not LINUX:
        return False
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ processes
#: the largest PID each OS hands out (Linux's ``pid_max`` is at most 2**22; Windows' are 32-bit)
PID_MAX = (1 << 32) - 1 if WINDOWS else 1 << 22


def _windows_pid_running(pid: int) -> bool:
    """Windows: whether ``OpenProcess`` finds ``pid`` and its exit code is still ``STILL_ACTIVE``."""
    if not WINDOWS:
        return True
    k32 = _kernel32()
    handle = k32.OpenProcess(0x1000, 0, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:  # ERROR_INVALID_PARAMETER: no such process; access denied and the rest: it may run
        return ctypes.get_last_error() != 87  # type: ignore[attr-defined]
    try:
        code = ctypes.c_uint32()
        if not k32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == 259  # STILL_ACTIVE
    finally:
        k32.CloseHandle(handle)


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` may still run: False only when the OS says there is no such process (a PID out of
    range, someone else's process, or any doubt: True). Windows: ``OpenProcess`` + ``GetExitCodeProcess``
    (``os.kill`` would terminate it there)."""
    if pid == os.getpid() or not 0 < pid <= PID_MAX:
        return True
    if WINDOWS:
        return _windows_pid_running(pid)
    try:
        os.kill(pid, 0)  # POSIX: signal 0 only asks
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # EPERM: alive, someone else's
        return True
    return True


# ------------------------------------------------------------------------------------ desktop session, folders
def has_display() -> bool:
    """Whether a window can open: on Linux and the BSDs a display server (``DISPLAY``, ``WAYLAND_DISPLAY``) or a
    Qt platform chosen explicitly (``QT_QPA_PLATFORM``); macOS and Windows always have their window system (no
    such variables there)."""
    if MACOS or WINDOWS:
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM"))


def wayland_without_x11() -> bool:
    """Whether the session is Wayland with no X11 server beside it (Linux and the BSDs: ``WAYLAND_DISPLAY`` set,
    ``DISPLAY`` not, so no XWayland); always False on macOS and Windows."""
    if MACOS or WINDOWS:
        return False
    return bool(os.environ.get("WAYLAND_DISPLAY")) and not os.environ.get("DISPLAY")


def user_cache_dir() -> Path:
    """The per-user folder for caches (re-creatable downloads, measurements), ``quantscope`` not included: Linux
    and the BSDs ``$XDG_CACHE_HOME`` (default ``~/.cache``), macOS ``~/Library/Caches``, Windows
    ``%LOCALAPPDATA%`` (default ``~/AppData/Local``)."""
    if MACOS:
        return Path.home() / "Library" / "Caches"
    if WINDOWS:
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def user_data_dir() -> Path:
    """The per-user folder for data the user keeps (conversations), ``quantscope`` not included: Linux and the BSDs
    ``$XDG_DATA_HOME`` (default ``~/.local/share``), macOS ``~/Library/Application Support``, Windows
    ``%APPDATA%`` (default ``~/AppData/Roaming``)."""
    if MACOS:
        return Path.home() / "Library" / "Application Support"
    if WINDOWS:
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def tool_folders() -> dict[str, list[Path]]:
    """Where the usual local-model tools keep models by default on this system, before their own environment
    overrides (core/library.py applies HF_HUB_CACHE, HF_HOME, OLLAMA_MODELS, LLAMA_CACHE): the Hugging Face cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``huggingface/hub``, on every system, as huggingface_hub does), LM
    Studio (``~/.lmstudio/models``, formerly ``~/.cache/lm-studio/models``), Ollama (``~/.ollama/models``; on Linux
    also the system service's ``/usr/share/ollama/.ollama/models``), llama.cpp's cache (the user cache folder's
    ``llama.cpp``) and GPT4All (``nomic.ai/GPT4All`` in ``%LOCALAPPDATA%``, ``~/Library/Application Support`` or
    ``$XDG_DATA_HOME``)."""
    home = Path.home()
    lm = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    if WINDOWS:
        local = Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
        hf = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub"
        return {"hf": [hf], "lmstudio": lm, "ollama": [home / ".ollama" / "models"],
                "llama.cpp": [local / "llama.cpp"], "gpt4all": [local / "nomic.ai" / "GPT4All"]}
    if MACOS:
        hf = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub"
        return {"hf": [hf], "lmstudio": lm, "ollama": [home / ".ollama" / "models"],
                "llama.cpp": [home / "Library" / "Caches" / "llama.cpp"],
                "gpt4all": [home / "Library" / "Application Support" / "nomic.ai" / "GPT4All"]}
    cache = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return {"hf": [cache / "huggingface" / "hub"], "lmstudio": lm,
            "ollama": [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")],
            "llama.cpp": [cache / "llama.cpp"], "gpt4all": [data / "nomic.ai" / "GPT4All"]}
