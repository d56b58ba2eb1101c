"""cffi (API mode) build of Quantscope's native library: ``quantscope.core.native._quantscope_native``.

Run by ``pip install`` through setup.py's ``cffi_modules``. Per-ISA code uses function target attributes,
never global ISA flags, so the library loads on any x86-64 CPU and dispatches at run time.
"""

from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
SOURCES = ["gguf_scan.c"]

CDEF = """
int qs_scan_strings(const uint8_t *buf, uint64_t len, uint64_t count, uint64_t max_len, int check_utf8,
                    uint64_t *offsets, uint64_t *out_end, uint64_t *err_pos, uint64_t *err_index);
uint64_t qs_utf8_invalid_at(const uint8_t *s, uint64_t n);
"""

ffibuilder = cffi.FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "quantscope.core.native._quantscope_native",
    '#include "gguf_scan.h"\n',
    sources=[str(Path("csrc") / s) for s in SOURCES],
    include_dirs=[str(Path("csrc"))],
    extra_compile_args=["-O2", "-std=gnu11", "-fno-strict-aliasing"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parent / "build" / "cffi"), verbose=True)
