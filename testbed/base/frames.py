"""A frame's size on the wire: the one place that knows the header sizes.

A RoCEv2 packet goes to UDP port 4791. A data packet on Ethernet: Ethernet 14 B, IPv4 20, UDP
8, BTH 12, on the first packet of a WRITE (FIRST or ONLY) a RETH 16, the payload, ICRC 4; no
FCS - what the kernel counts, the qdiscs queue and the timestamps see; an ACK carries an AETH
(4 B) in place of payload. Links carry IP packets up to their MTU: the RoCE path MTU
with room for those headers and more (``LINK_MTU_ROOM``), at least Ethernet's 1500.
"""
from __future__ import annotations

ROCE_UDP_PORT = 4791  # IANA, RoCEv2 (IBTA annex A17)
ETH_LEN, IP_LEN, UDP_LEN, BTH_LEN, RETH_LEN, AETH_LEN, ICRC_LEN = 14, 20, 8, 12, 16, 4, 4
# Ultra Ethernet (UE Spec 1.0): a request's PDS header, the SES standard request header, an
# ACK_CC and a NACK (PDS prologue included); no ICRC
UET_UDP_PORT = 4793
PDS_REQUEST_LEN, SES_REQUEST_LEN, PDS_ACK_CC_LEN, PDS_NACK_LEN = 12, 44, 32, 16
LINK_MTU_ROOM = 100  # a link's MTU over the RoCE path MTU: its 60 B of IP-level headers, and more


def roce_frame_bytes(payload, first: bool = False):
    """The frame of a RoCEv2 data packet carrying ``payload`` bytes (a number or an array):
    a WRITE MIDDLE or LAST; ``first``: a FIRST or ONLY, whose RETH adds 16 B."""
    return (payload + ETH_LEN + IP_LEN + UDP_LEN + BTH_LEN + ICRC_LEN
            + (RETH_LEN if first else 0))


def full_frame_bytes(roce_mtu: int) -> int:
    """The largest data frame of a RoCE path MTU (a FIRST carrying a full payload): the frame
    whose serialization time the fidelity tolerances and the agents' pacing count in."""
    return roce_frame_bytes(roce_mtu, first=True)


def ack_frame_bytes() -> int:
    """An ACK or NAK frame: BTH, AETH and ICRC behind the UDP header."""
    return ETH_LEN + IP_LEN + UDP_LEN + BTH_LEN + AETH_LEN + ICRC_LEN


def uet_frame_bytes(payload):
    """The frame of a UET data packet (an RMA write over RUD or ROD) carrying ``payload`` bytes:
    its PDS and SES headers; 0 is a trimmed packet's."""
    return payload + ETH_LEN + IP_LEN + UDP_LEN + PDS_REQUEST_LEN + SES_REQUEST_LEN


def udp_frame_bytes(datagram_bytes):
    """The frame around a UDP payload of ``datagram_bytes`` (a RoCE packet from its BTH on)."""
    return datagram_bytes + ETH_LEN + IP_LEN + UDP_LEN


def link_mtu(roce_mtu: int) -> int:
    """The MTU of every link, for RoCE packets of path MTU ``roce_mtu``."""
    return max(1500, roce_mtu + LINK_MTU_ROOM)


def link_frame_bytes(mtu: int) -> int:
    """The largest frame a link of MTU ``mtu`` carries."""
    return mtu + ETH_LEN
