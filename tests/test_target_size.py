"""Quantize to a size (issue 39): the engine's resumed forward pass, the measured costs and their cache, the
planner, the CLI's `--target-size`/`--target-bpw` and its rule file reproducing the file through `--tensor-type`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.kld import chunk_ids
from quantscope.core.engine.session import ForwardTrace, Model
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant.quantize import QuantizeError
from quantscope.core.quant.sensitivity import KLDMeter, tensor_costs
from quantscope.core.quant.target import parse_size, plan_target, rule_pattern
from quantscope.core.tokenizer import Tokenizer

from .arch_fixtures import vocabulary, write_fixture

TEXT = Path(__file__).parent / "data" / "english.txt"
TYPES = "Q4_0,Q5_0,Q8_0"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_fixture("llama", tmp_path_factory.mktemp("target") / "llama-F32.gguf", "F32", vocab=vocabulary())


def _chunks(f: GGUFFile, n_ctx: int = 32) -> np.ndarray:
    return chunk_ids(Tokenizer(f).encode(TEXT.read_text(encoding="utf-8")), n_ctx, 1, min_chunks=1)


def test_forward_from_a_layer_gives_the_whole_pass_logits(llama: Path) -> None:
    m = Model.load(str(llama), threads=1)
    s = m.session(32)
    ids = list(range(5, 37))
    trace = ForwardTrace()
    full = s.forward(ids, all_logits=True, trace=trace)
    for layer in range(m.config.n_layers + 1):
        np.testing.assert_array_equal(s.forward_from(trace.resid[layer], layer), full)
    with pytest.raises(ValueError):
        s.forward_from(trace.resid[0], m.config.n_layers + 1)
    with pytest.raises(ValueError):
        s.forward_from(np.zeros((4, 3), np.float32), 0)


def test_the_meter_reads_zero_for_the_tensor_itself_and_more_for_fewer_bits(llama: Path) -> None:
    from quantscope.core.quant.lab import requantize, tensor_values

    with GGUFFile(llama) as f:
        meter = KLDMeter(f, _chunks(f), threads=1)
        for name in ("blk.1.attn_v.weight", "blk.0.ffn_down.weight", "token_embd.weight", "output.weight"):
            same = np.array(f.tensor_bytes(f.tensor(name)))
            assert meter.kld(name, same, "F32") == 0.0
            v = tensor_values(f, name)
            k4 = meter.kld(name, requantize(v, "Q4_0")[0], "Q4_0")
            k8 = meter.kld(name, requantize(v, "Q8_0")[0], "Q8_0")
            assert 0 < k8 < k4, name
        with pytest.raises(ValueError, match="does not read"):
            meter.kld("blk.0.attn_norm.weight", np.zeros(4, np.uint8), "F32")


def test_costs_are_measured_at_the_anchor_extended_by_the_error_and_cached(llama: Path, tmp_path: Path) -> None:
    with GGUFFile(llama) as f:
        ch = _chunks(f)
        cands = [("blk.0.attn_q.weight", ["Q8_0", "Q4_0", "Q5_0"]), ("blk.1.ffn_up.weight", ["Q4_0", "Q8_0"])]
        tm: dict[str, float] = {}
        first = tensor_costs(f, cands, ch, cache_dir=tmp_path, threads=1, timings=tm)
        assert tm["kld_runs"] == 2  # one measurement per tensor: its smallest type
        for c in first:
            assert c.anchor == "Q4_0"
            assert c.measured == {q: q == "Q4_0" for q in dict(cands)[c.name]}
            assert c.costs["Q8_0"] == pytest.approx(c.costs["Q4_0"] * c.errors["Q8_0"] / c.errors["Q4_0"])
            assert c.costs["Q8_0"] < c.costs["Q4_0"]
        tm2: dict[str, float] = {}
        again = tensor_costs(f, cands, ch, cache_dir=tmp_path, threads=1, timings=tm2)
        assert "kld_runs" not in tm2 and "reference" not in tm2  # every value from the cache
        assert [c.costs for c in again] == [c.costs for c in first]
        exact = tensor_costs(f, cands[:1], ch, cache_dir=tmp_path, exact=True, threads=1)[0]
        assert all(exact.measured.values()) and exact.costs["Q4_0"] == first[0].costs["Q4_0"]


def test_parse_size() -> None:
    assert parse_size("4.2G") == int(4.2 * 2**30)
    assert parse_size("900M") == 900 * 2**20
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("4200MB") == 4_200_000_000
    assert parse_size("123456") == 123456
    for bad in ("", "G", "-1G", "0", "0.0001", "1.2.3G", "4.2X", "nanG", "1e3G", "1" * 40):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_rule_patterns_match_only_their_tensor() -> None:
    import re

    for name in ("blk.0.attn_q.weight", "a b=c\tweight", "blk.1.ffn_up_exps.weight"):
        p = rule_pattern(name)
        assert not any(ch.isspace() for ch in p) and p.count("=") == 0
        assert re.search(p, name) and not re.search(p, name + "x") and not re.search(p, "x" + name)
    assert not re.search(rule_pattern("blk.0.attn_q.weight"), "blk.0xattn_q.weight")


def test_plan_meets_the_budget_and_spends_it(llama: Path, tmp_path: Path) -> None:
    with GGUFFile(llama) as f:
        ch = _chunks(f)
        kw = dict(types=TYPES.split(","), cache_dir=tmp_path, threads=1)
        low = plan_target(f, ch, bpw=4.6, **kw)  # type: ignore[arg-type]
        high = plan_target(f, ch, bpw=7.0, **kw)  # type: ignore[arg-type]
        assert low.plan.out_bytes <= low.budget and high.plan.out_bytes <= high.budget
        assert high.predicted_cost <= low.predicted_cost
        size = low.plan.file_bytes
        by_size = plan_target(f, ch, size=size, **kw)  # type: ignore[arg-type]
        assert by_size.plan.file_bytes <= size
        with pytest.raises(QuantizeError, match="below the smallest mix"):
            plan_target(f, ch, size=by_size.smallest - 1, **kw)  # type: ignore[arg-type]
        with pytest.raises(QuantizeError, match="larger than the model in F32"):
            plan_target(f, ch, size=10 * Path(llama).stat().st_size, **kw)  # type: ignore[arg-type]


def test_cli_target_size_writes_the_file_and_a_rule_file_that_reproduces_it(llama: Path, tmp_path: Path,
                                                                             capsys) -> None:
    out = tmp_path / "mix.gguf"
    rules = tmp_path / "mix.rules.txt"
    cache = ["--cost-cache", str(tmp_path / "cache"), "--ctx", "32", "--threads", "1"]
    rc = main(["quantize", str(llama), "--dry-run", "--json", "--target-bpw", "5", "-f", str(TEXT), "--types",
               TYPES, *cache])
    assert rc == 0
    dry = json.loads(capsys.readouterr().out)
    q = next(r for r in dry["tensors"] if r["name"] == "blk.0.attn_q.weight")
    assert set(q["costs"]) == {"Q4_0", "Q5_0", "Q8_0"} and q["costs"]["Q4_0"]["measured"]
    assert q["costs"][q["to"]]["kld"] == q["cost"] and q["costs"]["Q8_0"]["kld"] < q["costs"]["Q4_0"]["kld"]
    assert next(r for r in dry["tensors"] if r["name"] == "blk.0.attn_norm.weight")["costs"] is None
    size = dry["summary"]["file_bytes"] + 100
    rc = main(["quantize", str(llama), str(out), "--target-size", str(size), "-f", str(TEXT), "--types", TYPES,
               "--rules", str(rules), *cache])
    assert rc == 0, capsys.readouterr().err
    assert out.stat().st_size <= size
    lines = rules.read_text().split()
    assert lines and all(line.startswith("^") and "=" in line for line in lines)
    with GGUFFile(out) as f:
        mixed = {t.name: t.type_name for t in f.tensors}
        preset = f.metadata["general.file_type"].value
    assert len({v for k, v in mixed.items() if k.endswith("weight") and "norm" not in k}) > 1  # a real mix
    # our quantizer driven by the rule file alone (as llama-quantize would be) writes the same bytes
    from quantscope.core.base.gguf_constants import FileType

    name = FileType(int(preset)).name.removeprefix("MOSTLY_")
    again = tmp_path / "again.gguf"
    rc = main(["quantize", str(llama), str(again), name, "--tensor-type-file", str(rules), "--threads", "1"])
    assert rc == 0, capsys.readouterr().err
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("args, message", [
    (["--target-size", "abc"], "is not a size"),
    (["--target-size", "0"], "not a positive size"),
    (["--target-size=-5G"], "is not a size"),
    (["--target-size", "3Q"], "unknown unit"),
    (["--target-size", "1T"], "larger than the model in F32"),
    (["--target-size", "10K"], "below the smallest mix"),
    (["--target-bpw", "0"], "out of range"),
    (["--target-bpw", "40"], "out of range"),
    (["--target-bpw", "nan"], "not a finite number"),
    (["--target-bpw", "5", "--types", "Q4_0,NOPE"], "unknown ggml type"),
    (["--target-bpw", "5", "--types", ","], "no candidate type"),
    (["--target-bpw", "5", "--target-size", "1G"], "not both"),
])
def test_cli_refuses_bad_targets_in_one_line(llama: Path, tmp_path: Path, capsys, args: list[str],
                                             message: str) -> None:
    rc = main(["quantize", str(llama), "--dry-run", "-f", str(TEXT), "--cost-cache", str(tmp_path), "--ctx", "32",
               *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("quantscope: error:") and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("*.json"))  # refused before any measuring


def test_cli_target_needs_a_calibration_text(llama: Path, capsys) -> None:
    assert main(["quantize", str(llama), "--dry-run", "--target-bpw", "5"]) == 2
    assert "calibration text" in capsys.readouterr().err
    assert main(["quantize", str(llama), "Q8_0", "--dry-run", "--types", "Q4_0"]) == 2
    assert "goes with --target-size" in capsys.readouterr().err


def test_a_mixture_of_experts_plans_per_expert_tensor(tmp_path: Path) -> None:
    """3-D expert tensors: measured as one tensor (every expert's rows swapped), the weighted error per expert."""
    moe = write_fixture("qwen3moe", tmp_path / "qwen3moe.gguf", "F32", vocab=vocabulary())
    with GGUFFile(moe) as f:
        exps = [t.name for t in f.tensors if "_exps" in t.name]
        assert exps
        tp = plan_target(f, _chunks(f), bpw=9.0, types=TYPES.split(","), cache_dir=tmp_path, threads=1)
        assert tp.plan.out_bytes <= tp.budget
        for n in exps:
            c = tp.costs[n]
            if f.tensor(n).ne[0] % 32:  # rows of 48: no candidate fits, llama-quantize's fallback (F16) is fixed
                assert c.costs == {"F16": 0.0} and tp.choices[n] == "F16"
            else:
                assert c.costs[c.anchor] > 0 and c.measured[c.anchor]


def test_a_whole_mix_is_measured_at_once(llama: Path) -> None:
    """mix_kld: one tensor swapped reads what the meter reads for it; the whole mix is measured, not summed."""
    from quantscope.core.quant.lab import requantize, tensor_values
    from quantscope.core.quant.sensitivity import mix_kld

    with GGUFFile(llama) as f:
        ch = _chunks(f)
        meter = KLDMeter(f, ch, threads=1)
        one = "blk.1.ffn_down.weight"
        alone = meter.kld(one, requantize(tensor_values(f, one), "Q4_0")[0], "Q4_0")
        assert mix_kld(f, {one: "Q4_0"}, ch, threads=1, meter=meter) == pytest.approx(alone, rel=1e-6)
        assert mix_kld(f, {one: "F32"}, ch, threads=1, meter=meter) == 0.0  # its own type: copied
        two = {one: "Q4_0", "blk.0.attn_q.weight": "Q4_0", "output.weight": "Q4_0"}
        both = mix_kld(f, two, ch, threads=1, meter=meter)
        assert both > alone
        parts = [mix_kld(f, {n: q}, ch, threads=1, meter=meter) for n, q in two.items()]
        assert both != pytest.approx(sum(parts), rel=1e-9)  # measured together, not added


def test_refine_measures_the_chosen_estimates_and_the_whole_mix(llama: Path, tmp_path: Path) -> None:
    from quantscope.core.quant.sensitivity import mix_kld
    from quantscope.core.quant.target import refine_target, target_space

    with GGUFFile(llama) as f:
        ch = _chunks(f)
        tp = plan_target(f, ch, bpw=6.0, types=TYPES.split(","), cache_dir=tmp_path, threads=1)
        estimated = [n for n, q in tp.choices.items() if not tp.costs[n].measured.get(q)]
        assert estimated  # the mix leans on extended costs: something to refine
        space = target_space(f, types=TYPES.split(","), threads=1)
        r = refine_target(tp, space, ch, top=3, rounds=1, cache_dir=tmp_path)
        assert r.rounds == 1 and r.newly_measured == min(3, len(estimated))
        newly = [n for n in estimated if r.plan.costs[n].measured.get(tp.choices[n])]
        assert len(newly) == r.newly_measured  # those estimates are measurements now
        assert r.plan.plan.out_bytes <= r.plan.budget and not r.plan.by_file
        assert r.predicted_before == tp.predicted_cost
        assert r.measured_kld == pytest.approx(mix_kld(f, r.plan.choices, ch, threads=1), rel=1e-6)
        assert r.swapped == [(n, tp.choices[n], q) for n, q in r.plan.choices.items() if tp.choices[n] != q]


def test_target_space_front_and_presets_share_one_scale(llama: Path, tmp_path: Path) -> None:
    from quantscope.core.quant.quantize import QuantizeOptions, plan_quantize
    from quantscope.core.quant.target import target_space

    with GGUFFile(llama) as f:
        space = target_space(f, types=TYPES.split(","), threads=1)
        cands = space.measure_candidates(("Q4_K_M", "Q5_K_M"))
        assert [n for n, _ in cands] == [n for n, _ in space.candidates]
        assert any("Q5_1" in qs for _, qs in cands)  # Q5_K_M's fallback for rows of 32-blocks only
        costs = tensor_costs(f, cands, _chunks(f), cache_dir=tmp_path, threads=1)
        front = space.front(costs, 16)
        assert [m.file_bytes for m in front] == sorted(m.file_bytes for m in front)
        assert front[0].file_bytes == space.smallest_file_bytes
        assert all(set(m.choices.values()) <= set(TYPES.split(",")) for m in front)  # only the candidates
        for p in ("Q4_K_M", "Q5_K_M"):
            pm = space.preset_mix(p, costs)
            assert pm is not None and pm.file_bytes == plan_quantize(f, QuantizeOptions(p)).file_bytes
            best = space.solve(costs, size=pm.file_bytes)
            assert best.file_bytes <= pm.file_bytes
        assert space.preset_mix("Q5_K_M", tensor_costs(f, space.candidates, _chunks(f), cache_dir=tmp_path,
                                                       threads=1)) is None  # its Q5_1 was not measured


def test_cli_sensitivity_reports_per_tensor_and_per_layer(llama: Path, tmp_path: Path, capsys) -> None:
    cache = ["--cost-cache", str(tmp_path), "--ctx", "32", "--threads", "1"]
    assert main(["sensitivity", str(llama), "-f", str(TEXT), "--types", TYPES, "--json", *cache]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["types"] == ["Q4_0", "Q5_0", "Q8_0"]
    with GGUFFile(llama) as f:
        costs = tensor_costs(f, [(t["name"], TYPES.split(",")) for t in rep["tensors"]], _chunks(f),
                             cache_dir=tmp_path, threads=1)
    for t, c in zip(rep["tensors"], costs, strict=True):
        assert {q: v["value"] for q, v in t["kld"].items()} == c.costs
        assert {q: v["measured"] for q, v in t["kld"].items()} == c.measured
    layer0 = next(r for r in rep["layers"] if r["layer"] == 0)
    in0 = [t for t in rep["tensors"] if t["layer"] == 0]
    assert layer0["tensors"] == len(in0) > 1
    assert layer0["kld"]["Q4_0"]["sum"] == pytest.approx(sum(t["kld"]["Q4_0"]["value"] for t in in0))
    assert main(["sensitivity", str(llama), "-f", str(TEXT), "--types", TYPES, *cache]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and "~" in out and "\nlayer " in out
    assert main(["sensitivity", str(llama), "-f", str(TEXT), "--types", "NOPE", *cache]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error:") and "unknown ggml type" in err and err.count("\n") == 1


def test_cli_refine_reports_the_measured_mix(llama: Path, tmp_path: Path, capsys) -> None:
    rc = main(["quantize", str(llama), "--dry-run", "--json", "--target-bpw", "6", "-f", str(TEXT), "--types",
               TYPES, "--refine", "2", "--cost-cache", str(tmp_path), "--ctx", "32", "--threads", "1"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["refine"]["measured_kld"] > 0 and s["refine"]["newly_measured"] <= 4
    assert s["bytes_out"] <= s["target_bytes"]


def test_cancel_stops_the_reference_pass_and_the_whole_mix(llama: Path, tmp_path: Path) -> None:
    """A cancel is honoured between chunks of the reference pass (which, for a large model and many chunks, is the
    longest step before the first measurement) and of the whole-mix measurement, not only between tensors."""
    from quantscope.core.quant.sensitivity import CostCancelled, mix_kld, tensor_costs

    with GGUFFile(llama) as f:
        ch = np.concatenate([_chunks(f)] * 3)
        asked: list[int] = []

        def cancel_at(n: int):
            def cancel() -> bool:
                asked.append(1)
                return len(asked) >= n
            return cancel

        with pytest.raises(CostCancelled):
            KLDMeter(f, ch, threads=1, cancel=cancel_at(2))  # the second chunk of the reference
        assert len(asked) == 2
        asked.clear()
        cands = [("blk.0.attn_q.weight", ["Q4_0", "Q8_0"])]
        with pytest.raises(CostCancelled):  # the first tensor's check passes; the reference pass is cancelled
            tensor_costs(f, cands, ch, cache_dir=tmp_path, threads=1, cancel=cancel_at(3))
        meter = KLDMeter(f, ch, threads=1)
        asked.clear()
        with pytest.raises(CostCancelled):
            mix_kld(f, {"blk.0.attn_q.weight": "Q4_0"}, ch, threads=1, meter=meter, cancel=cancel_at(3))
        assert len(asked) == 3


def test_the_default_candidates_hold_every_type_the_k_presets_give(llama: Path, tmp_path: Path) -> None:
    """With the default types, each tensor's type in Q3_K_M, Q4_K_M and Q5_K_M (fallbacks for rows the 256-blocks
    do not divide included: this fixture's rows of 32-blocks take Q5_1 in Q5_K_M) is one of its candidates, so the
    preset's mix is a choice the solver has; the solve at a preset's size is then predicted no worse than it."""
    from quantscope.core.quant.target import target_space

    with GGUFFile(llama) as f:
        space = target_space(f, threads=1)
        allowed = dict(space.candidates)
        costs = tensor_costs(f, space.candidates, _chunks(f), cache_dir=tmp_path, threads=1)
        for p in ("Q3_K_M", "Q4_K_M", "Q5_K_M"):
            types = space.preset_types(p)
            assert types and all(q in allowed[n] for n, q in types.items()), p
            pm = space.preset_mix(p, costs)
            assert pm is not None
            best = space.solve(costs, size=pm.file_bytes)
            assert best.file_bytes <= pm.file_bytes and best.cost <= pm.cost + 1e-12
