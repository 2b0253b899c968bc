"""tshark, an independent dissector, reads our RoCEv2 frames as InfiniBand BTH/RETH."""
import shutil
import subprocess

import pytest
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from traffic.roce import (RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_LAST, RC_RDMA_WRITE_MIDDLE,
                          Connection, Endpoint)

FIELDS = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
          "infiniband.bth.a", "infiniband.reth.va", "infiniband.reth.r_key",
          "infiniband.reth.dmalen", "infiniband.invariant.crc"]


def tshark_fields(pcap, display_filter=None):
    cmd = ["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=|"]
    if display_filter:
        cmd += ["-Y", display_filter]
    for f in FIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [dict(zip(FIELDS, line.split("|"))) for line in out.strip().splitlines()]


@pytest.mark.skipif(not shutil.which("tshark"), reason="tshark not installed "
                    "(scripts/install.sh installs it)")
def test_tshark_dissects_template_frames(tmp_path):
    conn = Connection(Endpoint("02:00:0a:00:01:01", "10.0.1.1"),
                      Endpoint("02:00:0a:00:02:01", "10.0.2.1"), 0xC5A5, 0x010203)
    frames = []
    for psn, op in enumerate([RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_MIDDLE, RC_RDMA_WRITE_LAST]):
        tpl = conn.template(op, 1024)
        frames.append(Ether(bytes(tpl.fill(100 + psn, op == RC_RDMA_WRITE_LAST, 1, 0, psn,
                                           va=0xABC000, dlen=3072))))
    pcap = tmp_path / "roce.pcap"
    wrpcap(str(pcap), frames)
    rows = tshark_fields(pcap)
    assert [int(r["infiniband.bth.opcode"]) for r in rows] == [6, 7, 8]
    assert {int(r["infiniband.bth.destqp"], 16) for r in rows} == {0x010203}
    assert [int(r["infiniband.bth.psn"]) for r in rows] == [100, 101, 102]
    assert [r["infiniband.bth.a"] for r in rows] in (["0", "0", "1"],
                                                     ["False", "False", "True"])
    assert int(rows[0]["infiniband.reth.va"], 16) == 0xABC000
    assert int(rows[0]["infiniband.reth.dmalen"]) == 3072
    assert rows[1]["infiniband.reth.va"] == ""  # MIDDLE has no RETH
    icrc = int(rows[2]["infiniband.invariant.crc"], 16)
    assert icrc.to_bytes(4, "big") == bytes(frames[2])[-4:]
