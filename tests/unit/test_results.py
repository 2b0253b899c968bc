import csv
import json
import os

from testbed.results import collect, summary_table, write_json_atomic
from traffic.agent import PACKET_FIELDS, STEP_FIELDS


def _write_agent(d, host, rank, packets, steps, tx_packets):
    with open(os.path.join(d, f"{host}.packets.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PACKET_FIELDS)
        w.writerows(packets)
    with open(os.path.join(d, f"{host}.steps.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(STEP_FIELDS)
        w.writerows(steps)
    with open(os.path.join(d, f"{host}.summary.json"), "w") as f:
        json.dump({"rank": rank, "host": host, "counters": {"tx_packets": tx_packets},
                   "rx_packets": len(packets)}, f)


def test_collect_from_agent_records(tmp_path):
    d = str(tmp_path)
    # gpu1 receives 2 packets from rank 1 (latency 10 us, 30 us); gpu2 receives 1 (20 us)
    _write_agent(d, "gpu1", 0, [(1, 0, 0, 100, 1000, 11000, 0, 0), (1, 0, 1, 100, 2000, 32000,
                                                                        0, 0)],
                 [(0, 0, 0, 1, 1, 1000, 2000, 40000, 40000, 1, 100, 2, 2, 0)], tx_packets=1)
    _write_agent(d, "gpu2", 1, [(0, 1, 0, 100, 5000, 25000, 0, 0)],
                 [(1, 0, 0, 0, 0, 3000, 4000, 50000, 50000, 2, 200, 1, 1, 0)], tx_packets=3)
    r = collect(d, size_bytes=300)
    assert r["packets_sent"] == 4 and r["packets_received"] == 3 and r["drops"] == 1
    assert r["latency_us"]["max"] == 30.0 and r["latency_us"]["count"] == 3
    assert r["cct_us"]["per_iteration"] == [49.0]  # 50000 - 1000 ns
    assert list(r["per_gpu"]) == ["gpu1", "gpu2"]
    assert r["per_gpu"]["gpu1"]["packets_received"] == 2
    assert r["per_gpu"]["gpu2"]["latency_us_p50"] == 20.0
    assert r["agents_reporting"] == 2


def test_summary_table_lists_policies_and_every_gpu():
    results = {"time_scale": 2500.0,
               "scenario": {"topology": {"modelled_rate_gbit": 100.0}},
               "policies": {"hyperscale": {
                   "gpus": 2, "packets_sent": 10, "packets_received": 9, "drops": 1,
                   "latency_us": {"p50": 1.5, "p99": 2.0, "p999": 2.0, "max": 3.0},
                   "cct_us": {"p50": 2000.0, "p99": 2500.0, "max": 2600.0},
                   "spine_load_packets": {"sp1": 3, "sp2": 4},
                   "per_gpu": {"gpu1": {"rank": 0, "packets_sent": 5, "packets_received": 4,
                                        "latency_us_p50": 1.0, "latency_us_p99": 2.0},
                               "gpu2": {"rank": 1, "packets_sent": 5, "packets_received": 5,
                                        "latency_us_p50": None, "latency_us_p99": None}}}}}
    text = summary_table(results)
    assert "hyperscale" in text and "3 / 4" in text and "2.0" in text  # CCT p50 in ms
    assert "gpu1" in text and "gpu2" in text and "2,500x" in text


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    write_json_atomic(str(path), {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["results.json"]


def test_latency_joins_the_senders_kernel_transmit_times(tmp_path):
    d = str(tmp_path)
    # rank 1 sent at app time 1000 and 2000; the kernel transmitted them at 1500 and 2600
    _write_agent(d, "gpu1", 0, [(1, 0, 0, 100, 1000, 11000, 0, 0), (1, 0, 1, 100, 2000, 32000,
                                                                        0, 0)],
                 [(0, 0, 0, 1, 1, 1000, 40000, 40000, 40000, 100, 1)], tx_packets=0)
    _write_agent(d, "gpu2", 1, [], [(1, 0, 0, 0, 0, 3000, 50000, 50000, 50000, 200, 1)],
                 tx_packets=2)
    with open(os.path.join(d, "gpu2.tx.csv"), "w") as f:
        f.write("sent_ns,tx_ns\n1000,1500\n2000,2600\n")
    r = collect(d, size_bytes=300)
    assert r["latency_app_clock"] == 0
    assert r["latency_us"]["max"] == 29.4 and r["latency_us"]["count"] == 2  # 32000 - 2600
