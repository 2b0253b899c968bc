"""The ultra-ethernet policy's switch side: classes (a trimmed data class below a
strict-priority header class) and per-packet ECMP on the entropy value."""
import collections

from controllers.classes import class_of
from controllers.params import UltraEthernetParams
from controllers.ultraethernet import UltraEthernetPolicy
from testbed.base.frames import UET_UDP_PORT
from testbed.base.topology import FabricPlan
from tests.fakeoftable import FakeFabric, udp_packet


def test_data_trims_into_the_strict_priority_header_class():
    p = UltraEthernetParams()
    header, data, other = UltraEthernetPolicy(FabricPlan(2, 2, 2), p).traffic_classes()
    assert header.priority < data.priority < other.priority
    assert class_of(p.data_dscp, (header, data, other)) is data and not data.lossless
    assert data.trim.limit == data.buffer_bytes == p.buffer_bytes
    assert data.trim.dscp == p.header_dscp
    assert class_of(p.header_dscp, (header, data, other)) is header
    # ECN between 0.2 and 0.8 of the buffer (about one BDP)
    assert (data.ecn.kmin, data.ecn.kmax) == (0.2 * p.buffer_bytes, 0.8 * p.buffer_bytes)
    bare = UltraEthernetPolicy(FabricPlan(2, 2, 2), UltraEthernetParams(trimming=False))
    assert bare.traffic_classes()[1].trim is None


def test_the_entropy_value_picks_the_spine_of_every_packet():
    plan = FabricPlan(4, 2, 2)
    fabric = FakeFabric(plan, UltraEthernetPolicy(plan, UltraEthernetParams()))
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    spines = collections.Counter(
        fabric.send(src.name, udp_packet(src, dst, sport=ev, dport=UET_UDP_PORT))[1][1]
        for ev in range(0xC000, 0xC000 + 64))
    assert set(spines) == {"sp1", "sp2", "sp3", "sp4"} and min(spines.values()) >= 8
    (got, _), path = fabric.send(src.name, udp_packet(src, dst, dport=UET_UDP_PORT))
    assert got == "gpu3" and len(path) == 3
