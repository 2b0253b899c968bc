"""The nccl-tests output format, read back the way nccl-tests log parsers read it."""
import json

import pytest

from testbed.results import nccltests
from testbed.results.model import PolicyResult, RunResult

SCALE = 2500.0


def _sweep(gpus, *entries):
    """A policy's collectives as a run writes them: CCTs as run, ``SCALE`` slower than the
    modelled ``(collective, size, modelled CCT p50)`` of each entry."""
    return {"gpus": gpus, "modelled": {}, "collectives": [
        {"collective": c, "size_bytes": size, "cct_us": {"p50": cct * SCALE}, "modelled": {}}
        for c, size, cct in entries]}


def modelled(policy):
    return PolicyResult.from_json(policy).in_modelled_time(SCALE)


SWEEP = _sweep(8, ("ring", 65536, 9.5), ("ring", 1 << 20, 152.6), ("ring", 64 << 20, 10_880.0))


def parse(text):
    """What a parser of nccl-tests logs does: the header's column names, then whitespace-split
    rows of numbers, and the trailer's average."""
    lines = text.splitlines()
    names = next(line for line in lines if line.startswith("#") and "size" in line
                 and "busbw" in line).lstrip("#").split()
    rows = [dict(zip(names, line.split())) for line in lines
            if line.strip() and not line.startswith("#")]
    avg = next(float(line.split(":")[1]) for line in lines if "Avg bus bandwidth" in line)
    return names, rows, avg


def test_the_text_parses_as_nccl_tests_output_with_its_bus_bandwidth():
    names, rows, avg = parse(nccltests.text("hyperscale", modelled(SWEEP)))
    assert names == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                     "#wrong"]
    assert [int(r["size"]) for r in rows] == [65536, 1 << 20, 64 << 20]
    assert [int(r["count"]) for r in rows] == [16384, 1 << 18, 16 << 20]
    assert {(r["type"], r["redop"], r["root"], r["#wrong"]) for r in rows} == {
        ("float", "sum", "-1", "N/A")}
    for r, e in zip(rows, SWEEP["collectives"]):
        algbw = e["size_bytes"] / 1e9 / (e["cct_us"]["p50"] / SCALE / 1e6)  # GB/s
        assert float(r["algbw"]) == pytest.approx(algbw, abs=0.005)
        assert float(r["busbw"]) == pytest.approx(algbw * 2 * 7 / 8, abs=0.005)  # all-reduce
    assert [r["time"] for r in rows] == ["9.50", "152.6", "10880"]  # nccl-tests' precisions
    assert avg == pytest.approx(sum(float(r["busbw"]) for r in rows) / 3, rel=1e-3)


def test_an_all_to_all_reduces_nothing_and_uses_its_own_factor():
    a2a = _sweep(4, ("all_to_all", 4000, 1.0))
    _, (row,), _ = parse(nccltests.text("lossless", modelled(a2a)))
    assert row["redop"] == "none"
    assert float(row["busbw"]) == pytest.approx(4.0 * 3 / 4, abs=0.005)


def test_the_json_twin_holds_the_same_rows():
    results = RunResult.from_json("", {"scenario": {}, "time_scale": SCALE,
                                       "policies": {"hyperscale": SWEEP}})
    twin = json.loads(json.dumps(nccltests.as_json(results)))
    _, rows, avg = parse(nccltests.text("hyperscale", modelled(SWEEP)))
    got = twin["policies"]["hyperscale"]
    assert [r["size"] for r in got["rows"]] == [int(r["size"]) for r in rows]
    assert [round(r["busbw"], 2) for r in got["rows"]] == [float(r["busbw"]) for r in rows]
    assert got["avg_bus_bandwidth"] == pytest.approx(avg, rel=1e-5)


def test_a_job_scenario_is_refused_before_anything_runs(capsys):
    from testbed.cli import main
    assert main(["run", "--format", "nccl-tests"]) == 2  # the default is a training job
    assert "--format nccl-tests: reports collectives" in capsys.readouterr().err
