#!/usr/bin/env bash
# The desktop app bundle (PyInstaller, packaging/quantscope.spec), built and smoke-tested on this OS (issue 46):
#   1. build it (Linux: dist/quantscope/; macOS: Quantscope.app; Windows: quantscope.exe + quantscopew.exe);
#   2. move it elsewhere and run it with an empty environment: `quantscope inspect` and `dump-block` on a GGUF
#      written by gguf-py (values checked by tests/wheel_smoke.py's writer), `desktop install --dry-run`, and the
#      GUI opening that file offscreen and saving a screenshot (a PNG of the window's size);
#   3. pack the artefact CI uploads into OUT/artifact (tar.gz on Linux, zip of the .app on macOS, zip on Windows).
#   tests/run_bundle.sh [--out DIR]      default DIR: build/bundle (the PyInstaller work folder, logs, artefact)
# Runs in bash on Linux, macOS (bash 3.2) and Windows (Git Bash). Needs PyInstaller and gguf in the Python that
# has the project installed (.venv's when present, else python3/python on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: tests/run_bundle.sh [--out DIR]" >&2; exit 2 ;;
  esac
done
if [ -x .venv/bin/python ]; then PY=.venv/bin/python
elif command -v python3 >/dev/null 2>&1; then PY=python3
else PY=python; fi
"$PY" -c 'import PyInstaller' 2>/dev/null || { echo "run_bundle: PyInstaller is missing (pip install pyinstaller)" >&2; exit 1; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/dist" "$OUT/moved" "$OUT/artifact" && mkdir -p "$OUT/artifact" "$OUT/moved"
case "$(uname -s)" in
  Linux) OS=linux ;;
  Darwin) OS=macos ;;
  MINGW*|MSYS*|CYGWIN*) OS=windows ;;
  *) echo "run_bundle: no bundle for $(uname -s)" >&2; exit 1 ;;
esac

echo "run_bundle: building ($OS)" >&2
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath "$OUT/dist" --workpath "$OUT/work" \
  packaging/quantscope.spec >"$OUT/pyinstaller.log" 2>&1 || { tail -40 "$OUT/pyinstaller.log" >&2; exit 1; }

# moved: a bundle must not depend on where it was built
case $OS in
  macos) cp -R "$OUT/dist/Quantscope.app" "$OUT/moved/"; EXE="$OUT/moved/Quantscope.app/Contents/MacOS/quantscope"
         GUI=$EXE ;;
  windows) cp -R "$OUT/dist/quantscope" "$OUT/moved/"; EXE="$OUT/moved/quantscope/quantscope.exe"
           GUI="$OUT/moved/quantscope/quantscopew.exe"; [ -f "$GUI" ] || { echo "run_bundle: no quantscopew.exe" >&2; exit 1; } ;;
  *) cp -R "$OUT/dist/quantscope" "$OUT/moved/"; EXE="$OUT/moved/quantscope/quantscope"; GUI=$EXE ;;
esac
[ -f "$EXE" ] || { echo "run_bundle: $EXE was not built" >&2; exit 1; }

MODEL="$OUT/smoke.gguf"
"$PY" -c "import sys; sys.path.insert(0, 'tests'); import wheel_smoke; wheel_smoke.write_model(__import__('pathlib').Path(sys.argv[1]))" "$MODEL"

# an empty environment: only what the OS needs to start a program (and an offscreen Qt for the GUI check)
run_bare() {
  if [ "$OS" = windows ]; then
    env -i SYSTEMROOT="${SYSTEMROOT:-C:\\Windows}" TEMP="${TEMP:-/tmp}" TMP="${TMP:-/tmp}" \
      USERPROFILE="${USERPROFILE:-}" LOCALAPPDATA="${LOCALAPPDATA:-}" APPDATA="${APPDATA:-}" \
      QT_QPA_PLATFORM=offscreen "$@"
  else
    env -i HOME="$HOME" TMPDIR="${TMPDIR:-/tmp}" QT_QPA_PLATFORM=offscreen "$@"
  fi
}

echo "run_bundle: smoke test of $EXE" >&2
out=$(run_bare "$EXE" inspect "$MODEL") || { echo "$out" >&2; echo "run_bundle: inspect failed" >&2; exit 1; }
for t in f32 q8_0 q4_0 q4_k; do
  echo "$out" | grep -q "$t" || { echo "$out" >&2; echo "run_bundle: inspect does not list $t" >&2; exit 1; }
done
run_bare "$EXE" dump-block "$MODEL" q4_k --block 1 --json >"$OUT/dump.json"
"$PY" - "$OUT/dump.json" "$MODEL" <<'PYEOF'
import json, sys
import gguf, numpy as np
got = np.asarray(json.load(open(sys.argv[1]))["values"], dtype=np.float32)
t = next(t for t in gguf.GGUFReader(sys.argv[2]).tensors if t.name == "q4_k")
want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)[got.size:2 * got.size]
assert np.array_equal(got, want), "dump-block from the bundle differs from gguf-py"
PYEOF
run_bare "$EXE" desktop install --dry-run >"$OUT/desktop-plan.txt" || { cat "$OUT/desktop-plan.txt" >&2; exit 1; }
SHOT="$OUT/screenshot.png"
rm -f "$SHOT"
run_bare "$GUI" "$MODEL" --screenshot "$SHOT" --view block >"$OUT/gui.log" 2>&1 || {
  cat "$OUT/gui.log" >&2; echo "run_bundle: the GUI did not start" >&2; exit 1; }
"$PY" - "$SHOT" <<'PYEOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert w >= 600 and h >= 400, f"the screenshot is {w}x{h}"
print(f"run_bundle: GUI screenshot {w}x{h}", file=sys.stderr)
PYEOF

ARCH=$(uname -m)
case $OS in
  linux) tar -C "$OUT/dist" -czf "$OUT/artifact/quantscope-linux-$ARCH.tar.gz" quantscope ;;
  macos) ditto -c -k --keepParent "$OUT/dist/Quantscope.app" "$OUT/artifact/Quantscope-macos-$ARCH.zip" ;;
  windows) (cd "$OUT/dist" && "$PY" -m zipfile -c "$OUT/artifact/quantscope-windows-$ARCH.zip" quantscope) ;;
esac
echo "run_bundle: ok: $(ls "$OUT/artifact") ($(du -sh "$OUT/dist" | cut -f1) unpacked)" >&2
