"""Quantscope against llama.cpp's llama-bench on the same files, interleaved, on the CPU.

For each model, ``--reps`` rounds; each round runs, in an order that alternates between rounds:

* ours: ``python -m quantscope.cli bench FILE -p P -n N -t T -r 1 --json --backend cpu`` (one warm-up
  repetition inside, then one measured);
* llama-bench: ``-m FILE -p P -n N -t T -r 1 -o json`` with the file memory-mapped, once per repack setting
  (``--repack 0`` and ``1`` when this llama-bench has the switch; ``--help`` is asked);
* our read-bandwidth probe (``core.bench.memory_bandwidth``: a native read-only stream over 256 MiB at T
  threads), so the decode figures are compared with the bandwidth of the same minutes.

Every engine runs in its own process; its peak RSS is the high-water mark of that process's own memory (``VmHWM`` in
/proc/PID/status, polled while it runs). Not ``ru_maxrss``: Linux carries it across fork and exec, so a child of
this (large) script would report the script's size; without /proc (macOS) it is the ``ru_maxrss`` of wait4. Runs
unchanged on x86-64 and ARM64 (Linux/aarch64, macOS/arm64), where llama.cpp builds its own NEON paths. Medians over
the rounds are printed as a table: decode and prefill tokens/s of both and their ratios (ours / llama), decode GB/s
(bytes one decoded token reads: every tensor but the embedding, whose one row is negligible, unless the output is
tied to it; of a mixture of experts' expert tensors only the used share) and its fraction of the measured read
bandwidth, and our peak RSS against the budget file + KV cache (fp16, P + N positions) + 150 MB. ``--json`` keeps
every sample.

Models: catalogue names (fetched if missing), synthetic shapes ``1b``/``3b``/``8b`` (written into the cache if
missing, see ``quantscope bench --synthetic``) or GGUF paths. Default: the catalogue models and the synthetic
shapes already in the cache. llama-bench comes from ``--llama-bin DIR`` or tests/bench/llamacpp_build.py
(built once into ~/.cache). Figures are only worth something on an otherwise idle machine. Usage:

    python tests/bench/bench_vs_llama.py [--models smollm2,1b,8b] [--threads 2] [--reps 5] [-p 128] [-n 64]
                                         [--llama-bin DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llamacpp_build

from quantscope.core import catalog, synthetic
from quantscope.core.bench import child_peak_rss, peak_rss_bytes
from quantscope.core.cpu import cpu_name

RSS_SLACK = 150e6


def run_measured(cmd: list[str], timeout: float) -> tuple[str, float]:
    """Run ``cmd``; its stdout and peak RSS in bytes (VmHWM, polled every 20 ms: the mark only grows, so the last
    reading before the exit is the peak up to then; macOS: wait4's ru_maxrss). Raises RuntimeError with stderr on
    failure."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        peak = 0.0
        while True:
            peak = max(peak, float(peak_rss_bytes(p.pid)))
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                peak = child_peak_rss(peak, usage.ru_maxrss)
                break
            if time.monotonic() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                raise RuntimeError(f"timed out after {timeout:.0f} s: {' '.join(cmd)}")
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode:
            tail = err.read().decode(errors="replace").strip()[-1500:]
            raise RuntimeError(f"exit status {p.returncode}: {' '.join(cmd)}\n{tail}")
        return out.read().decode(errors="replace"), peak


def resolve_models(names: list[str]) -> list[tuple[str, Path]]:
    out = []
    for name in names:
        if name in catalog.MODELS:
            out.append((name, catalog.fetch(name, progress=lambda m: print(m, file=sys.stderr))))
        elif name in synthetic.SHAPES:
            print(f"synthetic {name}: {synthetic.synthetic_path(name)}", file=sys.stderr)
            shown = [-1]

            def tell(p: synthetic.SyntheticProgress, shown: list[int] = shown, name: str = name) -> None:
                pct = 100 * p.done // p.total
                if pct // 10 != shown[0] // 10:
                    print(f"synthetic {name}: writing, {pct}%", file=sys.stderr)
                shown[0] = pct

            out.append((f"synthetic-{name}", synthetic.ensure_synthetic(name, progress=tell)))
        elif Path(name).is_file():
            out.append((Path(name).name, Path(name)))
        else:
            raise SystemExit(f"unknown model {name!r}: a catalogue name ({', '.join(catalog.MODELS)}), a synthetic "
                             f"shape ({', '.join(synthetic.SHAPES)}) or a GGUF file")
    return out


def default_models() -> list[str]:
    present = [n for n in synthetic.SHAPES if n != "tiny" and synthetic.is_complete(synthetic.synthetic_path(n), n)]
    return [*catalog.MODELS, *present]


def model_facts(path: Path, n_ctx: int) -> dict[str, Any]:
    """File size, bytes one decoded token reads, KV cache bytes (fp16) for ``n_ctx`` positions, and a title."""
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.model import read_config
    from quantscope.core.summary import experts_summary

    with GGUFFile(path) as f:
        cfg = read_config(f)
        ex = experts_summary(f)  # a mixture of experts reads only the picked experts' share of the expert tensors
        weights = ex["active_bytes"] if ex else sum(t.n_bytes or 0 for t in f.tensors)
        tied = not f.has_tensor("output.weight")
        per_token = weights - (0 if tied else f.tensor("token_embd.weight").n_bytes or 0)
        title = f.get("general.name") or path.name
    kv = 2 * cfg.n_layers * n_ctx * cfg.n_head_kv * cfg.head_dim * 2
    return {"file": str(path), "size": path.stat().st_size, "decode_bytes": per_token, "kv_bytes": kv,
            "title": title, "tied": tied}


def llama_switches(bench: Path) -> dict[str, Any]:
    """What this llama-bench accepts: repack settings and how to ask for mmap."""
    text = subprocess.run([str(bench), "--help"], capture_output=True, text=True).stdout
    mmap = ["-lm", "mmap"] if "--load-mode" in text else ["-mmp", "1"] if "--mmap" in text else []
    repack = ["0", "1"] if "--repack" in text else [""]
    return {"mmap": mmap, "repack": repack}


def ours_cmd(path: Path, a: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "quantscope.cli", "bench", str(path), "-p", str(a.n_prompt), "-n",
            str(a.n_gen), "-t", str(a.threads), "-r", "1", "--json", "--backend", "cpu"]


def llama_cmd(bench: Path, path: Path, a: argparse.Namespace, sw: dict[str, Any], repack: str) -> list[str]:
    cmd = [str(bench), "-m", str(path), "-p", str(a.n_prompt), "-n", str(a.n_gen), "-t", str(a.threads),
           "-r", "1", "-o", "json", *sw["mmap"]]
    return cmd + (["--repack", repack] if repack else [])


def parse_ours(text: str) -> dict[str, float]:
    rows = json.loads(text)
    return {("pp" if r["test"].startswith("pp") else "tg"): r["tokens_per_s"] for r in rows} | {
        "isa": rows[0]["isa"]}


def parse_llama(text: str) -> dict[str, Any]:
    rows = json.loads(text)
    out: dict[str, Any] = {"build": f"{rows[0].get('build_commit', '?')} ({rows[0].get('build_number', '?')})"}
    for r in rows:
        out["pp" if r["n_prompt"] and not r["n_gen"] else "tg"] = r["avg_ts"]
    return out


def bench_model(name: str, path: Path, bench: Path, sw: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    from quantscope.core.bench import memory_bandwidth

    facts = model_facts(path, a.n_prompt + a.n_gen)
    variants = {"ours": ours_cmd(path, a)} | {
        f"llama{'-repack' + r if r else ''}": llama_cmd(bench, path, a, sw, r) for r in sw["repack"]}
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    errors: dict[str, str] = {}
    bw: list[float] = []
    for rep in range(a.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for key in order:
            if key in errors:
                continue
            try:
                text, rss = run_measured(variants[key], a.timeout)
                s = parse_ours(text) if key == "ours" else parse_llama(text)
            except (RuntimeError, ValueError, KeyError, IndexError) as exc:
                errors[key] = str(exc)
                print(f"{name} {key}: {exc}", file=sys.stderr)
                continue
            s["peak_rss"] = rss
            samples[key].append(s)
            print(f"{name} round {rep + 1}/{a.reps} {key}: pp {s.get('pp', 0):.2f} tg {s.get('tg', 0):.2f} t/s",
                  file=sys.stderr)
        bw.append(memory_bandwidth(threads=(a.threads,))[f"read_gbs_{a.threads}t"])

    def med(key: str, field: str) -> float:
        vals = [s[field] for s in samples[key] if field in s]
        return statistics.median(vals) if vals else float("nan")

    read_gbs = statistics.median(bw)
    result: dict[str, Any] = {"model": name, **facts, "read_gbs": read_gbs, "read_gbs_samples": bw,
                              "samples": samples, "errors": errors, "engines": {}}
    for key in variants:
        tg = med(key, "tg")
        result["engines"][key] = {"pp": med(key, "pp"), "tg": tg, "peak_rss": med(key, "peak_rss"),
                                  "decode_gbs": facts["decode_bytes"] * tg / 1e9}
    result["rss_budget"] = facts["size"] + facts["kv_bytes"] + RSS_SLACK
    return result


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"CPU: {meta['cpu']}; {meta['threads']} threads; pp{meta['n_prompt']} / tg{meta['n_gen']}; "
             f"median of {meta['reps']} interleaved rounds; ours {meta.get('isa', '?')}, llama.cpp {meta['llama']}",
             "",
             f"{'model':<22} {'size':>8} {'llama':<14} {'tg ours':>8} {'tg llama':>8} {'ratio':>6} "
             f"{'pp ours':>8} {'pp llama':>8} {'ratio':>6} {'tg GB/s':>7} {'%read':>6} {'RSS ours/budget':>16} "
             f"{'RSS llama':>9}"]
    for r in results:
        ours = r["engines"]["ours"]
        for key, e in r["engines"].items():
            if key == "ours":
                continue
            rss = f"{ours['peak_rss'] / 1e6:.0f}/{r['rss_budget'] / 1e6:.0f} MB"
            lines.append(
                f"{r['model']:<22} {r['size'] / 1e9:6.3f}GB {key:<14} {ours['tg']:8.2f} {e['tg']:8.2f} "
                f"{ours['tg'] / e['tg']:5.2f}x {ours['pp']:8.2f} {e['pp']:8.2f} {ours['pp'] / e['pp']:5.2f}x "
                f"{ours['decode_gbs']:7.2f} {100 * ours['decode_gbs'] / r['read_gbs']:5.0f}% "
                f"{rss:>16} {e['peak_rss'] / 1e6:6.0f} MB")
        lines.append(f"{'':<22} read bandwidth {r['read_gbs']:.1f} GB/s at {meta['threads']} threads "
                     f"(median of {len(r['read_gbs_samples'])}); llama tg GB/s: "
                     + ", ".join(f"{k} {e['decode_gbs']:.2f}" for k, e in r["engines"].items() if k != "ours"))
        for key, err in r["errors"].items():
            lines.append(f"{'':<22} {key} failed: {err.splitlines()[0]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated (default: catalogue models + cached synthetic shapes)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--reps", "-r", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--llama-bin", type=Path, help="folder holding llama-bench (default: build/reuse it)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    ap.add_argument("--json", type=Path, help="write every figure and sample here")
    a = ap.parse_args()
    bin_dir = a.llama_bin or llamacpp_build.build(jobs=os.cpu_count() or 2)
    source = "" if a.llama_bin else f", from the llama-cpp-python {llamacpp_build.VERSION} sdist"
    bench = bin_dir / "llama-bench"
    if not bench.is_file():
        raise SystemExit(f"no llama-bench in {bin_dir}")
    sw = llama_switches(bench)
    models = resolve_models(a.models.split(",") if a.models else default_models())
    meta: dict[str, Any] = {"cpu": cpu_name(), "threads": a.threads, "n_prompt": a.n_prompt,
                            "n_gen": a.n_gen, "reps": a.reps, "llama": "?", "llama_bench": str(bench),
                            "llama_switches": sw, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    results = []
    for name, path in models:
        r = bench_model(name, path, bench, sw, a)
        for key, ss in r["samples"].items():
            if ss and key == "ours":
                meta["isa"] = ss[0]["isa"]
            elif ss:
                meta["llama"] = ss[0]["build"] + source
        results.append(r)
    print(render(results, meta))
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
