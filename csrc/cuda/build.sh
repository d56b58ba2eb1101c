#!/usr/bin/env bash
# Build the optional CUDA backend: build/cuda/libquantscope_cuda.so (CUDA runtime linked statically, so the library
# needs only libc/libstdc++ and, at run time, the NVIDIA driver). Never part of `pip install` or CI.
#   csrc/cuda/build.sh               build (serialised with a lock)
#   csrc/cuda/build.sh --if-changed  build only when the sources changed since the last successful build
# Environment: QSC_ARCHS="80 90" (SASS archs; PTX of the highest is always added), QSC_OUT=path/to/lib.so,
#              NVCC=path/to/nvcc, QSC_JOBS=2 (parallel nvcc threads).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=csrc/cuda
OUT=${QSC_OUT:-build/cuda/libquantscope_cuda.so}
NVCC=${NVCC:-nvcc}
ARCHS=${QSC_ARCHS:-"75 80 86 89 90"}
STAMP="$OUT.stamp"
command -v "$NVCC" >/dev/null 2>&1 || { echo "cuda build: nvcc not found" >&2; exit 1; }
# (the CPU headers the device code includes count too: a changed qs_block layout must rebuild the library)
want=$( (cat "$SRC"/*.cu "$SRC"/*.cuh "$SRC"/*.h "$SRC"/build.sh csrc/qs_api_nn.h csrc/qs_plan.h csrc/qs_iq_grids.h
         echo "$ARCHS") | sha256sum | cut -c1-16)
if [ "${1:-}" = "--if-changed" ] && [ -f "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
mkdir -p "$(dirname "$OUT")"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
gencode=()
top=0
for a in $ARCHS; do
  gencode+=(-gencode "arch=compute_$a,code=sm_$a")
  [ "$a" -gt "$top" ] && top=$a
done
gencode+=(-gencode "arch=compute_$top,code=compute_$top")   # PTX: JIT-compiled on newer GPUs
flags=(-std=c++17 -O3 -Xcompiler -fPIC,-fno-strict-aliasing -cudart static --threads "${QSC_JOBS:-2}"
       "-DQSC_ARCHS=\"sm_${ARCHS// /,sm_}+compute_$top\"")
echo "cuda build: $("$NVCC" --version | tail -n 1) for sm ${ARCHS} + PTX compute_$top -> $OUT"
exec 9>/tmp/quantscope-cuda-build.lock
flock 9
"$NVCC" "${flags[@]}" -gencode arch=compute_$top,code=sm_$top -c "$SRC/qsc_host.cu" -o "$obj/host.o"
"$NVCC" "${flags[@]}" "${gencode[@]}" -c "$SRC/qsc_device.cu" -o "$obj/device.o"
"$NVCC" -shared -cudart static -Xlinker --exclude-libs,ALL "${gencode[@]}" "$obj/host.o" "$obj/device.o" -o "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$want" > "$STAMP"
echo "cuda build: ok"
