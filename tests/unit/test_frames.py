"""A frame's size on the wire comes from one place (testbed.base.frames), and it is the size
of the frames Scapy builds."""
import pytest

from testbed.base import frames
from traffic import roce
from traffic.roce import (RC_RDMA_WRITE_FIRST, RC_RDMA_WRITE_LAST, RC_RDMA_WRITE_MIDDLE,
                          RC_RDMA_WRITE_ONLY, Endpoint)

SRC = Endpoint("02:00:0a:00:01:01", "10.0.1.1")
DST = Endpoint("02:00:0a:00:02:01", "10.0.2.1")


@pytest.mark.parametrize("opcode, first", [(RC_RDMA_WRITE_FIRST, True),
                                           (RC_RDMA_WRITE_ONLY, True),
                                           (RC_RDMA_WRITE_MIDDLE, False),
                                           (RC_RDMA_WRITE_LAST, False)])
@pytest.mark.parametrize("payload", [1, 1024, 4096])
def test_a_data_frame_is_the_size_scapy_builds(opcode, first, payload):
    pkt = roce.scapy_packet(SRC, DST, 49152, opcode, 7, 1, b"x" * payload)
    assert len(bytes(pkt)) == frames.roce_frame_bytes(payload, first=first)


def test_the_full_frame_and_the_links():
    assert frames.full_frame_bytes(4096) == 4170  # what the agents' tx records show
    assert frames.link_mtu(4096) == 4196 and frames.link_mtu(256) == 1500
    assert frames.link_frame_bytes(frames.link_mtu(4096)) == 4210
    assert frames.udp_frame_bytes(0) == roce.BTH_OFFSET == 42
    assert frames.link_mtu(4096) >= frames.full_frame_bytes(4096) - frames.ETH_LEN


def test_an_ack_frame_is_the_size_scapy_builds_and_goes_to_the_roce_port():
    frame = roce.ack_frame(SRC, DST, 49152, 7, 0x68)
    assert len(frame) == frames.ack_frame_bytes() == 62
    assert int.from_bytes(frame[36:38], "big") == frames.ROCE_UDP_PORT == 4791
