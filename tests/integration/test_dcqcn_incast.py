"""DCQCN on an incast-heavy lossless collective pauses less than PFC alone without throttling
the collective: an all-to-all over 2:1 uplinks (``benchmarks/dcqcn.py``'s scenario at 1 MiB per
GPU, where DCQCN has the least room), two interleaved rounds each way at 10 Mbit/s.

With every CNP lowering the rate a QP recovers to (the paper's rule), PFC held the uplink
queues above Kmax, every frame was marked, and the targets ratcheted down: CCT 1.47-2.03x PFC
alone in single pairs of runs, 1.87x in medians of three. With ConnectX's rule (the target
follows the rate down only after a timer increase) 0.87-1.36x in single pairs, 0.93x in
medians of three, and pauses 0.16-0.26x (docs/time-scale.md, "DCQCN"). One pair of runs is
too noisy to tell the two apart; two rounds' sums are not."""
import pytest

from benchmarks.dcqcn import figures, scenario
from testbed.run import runner

pytestmark = pytest.mark.integration
SHORT = ("workload.size_bytes", str(1 << 20))  # 1 MiB per GPU: one DCQCN loop per flow


def test_dcqcn_pauses_less_than_pfc_alone_and_keeps_the_collective_s_pace(tmp_path):
    got = {"none": [], "dcqcn": []}
    for r in range(2):
        for cc in got:
            results, run_dir = runner.run(scenario(cc, 10.0, [SHORT]),
                                          out_root=str(tmp_path / f"{cc}-{r}"))
            got[cc].append(figures(results, run_dir))
            assert got[cc][-1]["fidelity"] == "ok", got

    def total(cc, key):
        return sum(f[key] for f in got[cc])
    assert total("none", "pauses") > 0, got
    assert total("dcqcn", "pauses") < 0.5 * total("none", "pauses"), got
    assert total("dcqcn", "cct_us") < 1.4 * total("none", "cct_us"), got
