"""The NIC's system-call edge: the C extension and the pure-Python implementation give the same
results, and the receive fast path delivers exactly as the agent's own data path would.

Datagrams go over loopback UDP (no root needed): real RoCEv2 payloads, built from the agent's
own templates, with real kernel receive timestamps and TOS bytes.
"""
import random
import socket
import struct
import time
import zlib
from dataclasses import replace

import pytest

from traffic import nicio, roce
from traffic.gpu import Gpu
from traffic.rnic import qp_number
from traffic.contract import Compute, GpuConfig, Peer, WorkloadSpec
from traffic.rxsocket import open_rx

from .test_agent_graph import _Loop, TRANSPORT

pytestmark = pytest.mark.skipif(not nicio.accelerated(),
                                reason="the C extension is not built (pip install -e .)")

ME, PEER = "127.0.0.1", "127.0.0.2"
SPORT = 0xC123


def _payload(frame) -> bytes:
    """The UDP payload of an Ethernet frame from a template."""
    return bytes(frame[roce.ETH_LEN + roce.IP_LEN + 8:])


def _conn(dqpn=0x105):
    return roce.Connection(roce.Endpoint("02:00:00:00:00:02", PEER),
                           roce.Endpoint("02:00:00:00:00:01", ME), SPORT, dqpn)


def _sender():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((PEER, SPORT))
    return s


def _datagrams():
    """One of every kind the parser tells apart."""
    conn = _conn()
    out = []
    for opcode, size in ((roce.RC_RDMA_WRITE_FIRST, 1024), (roce.RC_RDMA_WRITE_MIDDLE, 1024),
                         (roce.RC_RDMA_WRITE_LAST, 700), (roce.RC_RDMA_WRITE_ONLY, 16)):
        tpl = conn.template(opcode, size)
        out.append(_payload(tpl.fill(77, opcode == roce.RC_RDMA_WRITE_LAST, 123456789, 3,
                                     5 | 0x80000000, va=4096, dlen=size)))
    ack = roce.AckTemplate(roce.ack_frame(roce.Endpoint("02:00:00:00:00:02", PEER),
                                          roce.Endpoint("02:00:00:00:00:01", ME), SPORT, 0x105,
                                          0x68))
    out.append(_payload(ack.fill(99, 0x60, 12)))
    good = bytearray(out[0])
    good[-1] ^= 1
    out.append(bytes(good))  # bad ICRC
    out.append(b"\x06" * 10)  # shorter than BTH + ICRC
    bth = out[4][:12]  # an ACK without its AETH, its ICRC right
    prefix = roce.payload_prefix_crc(bth + b"\0" * 4, socket.inet_aton(PEER),
                                     socket.inet_aton(ME), SPORT)
    out.append(bth + struct.pack("<I", zlib.crc32(bth[8:], prefix)))
    return out


def test_receive_parses_every_kind_alike_in_c_and_python():
    rx_c, rx_py, tx = open_rx(ME, 0), open_rx(ME, 0), _sender()
    try:
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x6B)  # ECT(1) | CE bits
        for d in _datagrams():
            tx.sendto(d, rx_c.getsockname())
            tx.sendto(d, rx_py.getsockname())
        time.sleep(0.05)
        got_c = nicio.Receiver(rx_c, ME).read()
        got_py = nicio.Receiver(rx_py, ME, use_c=False).read()
    finally:
        for s in (rx_c, rx_py, tx):
            s.close()
    assert len(got_c) == len(got_py) == len(_datagrams())
    for c, py in zip(got_c, got_py):
        assert c[1] > 0 and py[1] > 0  # kernel receive times
        assert c[:1] + c[2:] == py[:1] + py[2:]
    statuses = [g[0] for g in got_c]
    assert statuses.count(nicio.BAD_ICRC) == 1 and statuses.count(nicio.SHORT) == 1
    assert got_c[-1][0] == nicio.OK and got_c[-1][9] == -1  # no AETH
    first = got_c[0]
    assert first[2] == 0x6B and first[6] == roce.RC_RDMA_WRITE_FIRST
    assert (first[9], first[10], first[11], first[12]) == (123456789, 3, 5 | 0x80000000, 1024)


def test_fill_send_writes_the_frame_the_template_fills():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sender = nicio.Sender(a)
        for opcode, size in ((roce.RC_RDMA_WRITE_FIRST, 4096), (roce.RC_RDMA_WRITE_MIDDLE, 4096),
                             (roce.RC_RDMA_WRITE_ONLY, 100)):
            tpl = _conn().template(opcode, size)
            n = sender.send(tpl, 0xABCDEF, True, 987654321, 7, 9, va=1 << 40, dlen=size)
            sent = b.recv(16384)
            want = bytes(_conn().template(opcode, size).fill(0xABCDEF, True, 987654321, 7, 9,
                                                             va=1 << 40, dlen=size))
            assert n == len(sent) and sent == want
            assert roce.icrc_ok(sent)
    finally:
        a.close()
        b.close()


def _gpu(reorder_ns: int = 0):
    """A GPU's RNIC (rank 0 of 2) whose receive socket is loopback UDP; its peer is rank 1.
    ``reorder_ns``: its responder places packets ahead of a gap (a fabric that reorders)."""
    cfg = GpuConfig(rank=0, host="gpu1", intf="x", ip=ME, mac="02:00:00:00:00:01", ranks=2,
                    mtu=1024, link_rate_bps=40e6, out_dir="/nonexistent",
                    transport=replace(TRANSPORT, ack_every=8, reorder_ns=reorder_ns), seed=1,
                    workloads=(WorkloadSpec("ring", 1 << 16, 3, 2, 1),), compute=Compute(),
                    straggler=None, peers=(Peer(1, "gpu2", PEER, "02:00:00:00:00:02"),))
    nic = Gpu(cfg, _Loop()).nic
    nic.qp(1, 0)
    return nic


def _stream(seed):
    """Data packets of rank 1's QP to rank 0 as a network delivers them: mostly in order,
    with losses (the two packets after a loss arrive, then go-back-N resends from it),
    duplicates, ACK requests, CE marks and message ends."""
    rng = random.Random(seed)
    conn = roce.Connection(roce.Endpoint("02:00:00:00:00:02", PEER),
                           roce.Endpoint("02:00:00:00:00:01", ME), SPORT, qp_number(0, 1))
    frames, now = [], time.time_ns()
    for m in range(12):
        n = rng.randint(1, 9)
        for i, op in enumerate(roce.opcodes_for(n)):
            frames.append(_payload(conn.template(op, 1024).fill(
                len(frames), i == n - 1 and m % 3 == 0, now - 1000, m % 3, m, dlen=n * 1024)))
    out, k = [], 0
    while k < len(frames):
        tos = 0x6B if rng.random() < 0.05 else 0x6A
        if rng.random() < 0.04:  # lost: the next two arrive, then the sender goes back
            out += [(f, 0x6A) for f in frames[k + 1:k + 3]]
        out.append((frames[k], tos))
        if rng.random() < 0.04:
            out.append((frames[k], tos))  # duplicated
        k += 1
    return out


@pytest.mark.parametrize("seed,reorder_ns", [(s, 0) for s in range(6)]
                         + [(s, 10**12) for s in range(3)])
def test_the_fast_path_delivers_exactly_as_the_agents_data_path(seed, reorder_ns):
    """Same packets, same batches: the GPU's responder state, records, counters and answers
    are the same whether the C fast path or the Python path delivered them - also where the
    responder places packets ahead of a gap (the fast path only while none is)."""
    results = []
    stream = _stream(seed)
    for fast in (True, False):
        gpu = _gpu(reorder_ns)
        gpu.rx = open_rx(ME, 0)
        gpu.receiver = nicio.Receiver(gpu.rx, ME, use_c=fast)
        gpu.fast = (gpu.by_qpn, gpu.rank_by_addr, gpu.packets, gpu.rank, gpu.iterations,
                    10**9)
        full_path = []
        on_data = gpu._on_data
        gpu._on_data = lambda *a: full_path.append(a) or on_data(*a)
        tx = _sender()
        try:
            for start in range(0, len(stream), 10):  # batches of 10 packets
                for frame, tos in stream[start:start + 10]:
                    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
                    tx.sendto(frame, gpu.rx.getsockname())
                time.sleep(0.01)
                gpu.receive()
        finally:
            tx.close()
            gpu.rx.close()
        qp = gpu.qp(1, 0)
        r = qp.resp
        results.append({
            "packets": [p[:5] + p[6:] for p in gpu.packets],  # all but the receive time
            "responder": (r.epsn, r.msn, r.unacked, r.nak_sent, dict(r.counters),
                          r.in_order_only),
            "counters": dict(gpu.counters),
            "answers": [bytes(f) for _qp, f in gpu.control],
            "placed": dict(qp.placed), "full_path": len(full_path)})
    fast, slow = results
    # most went the fast way; with a reordering responder, packets placed ahead and the
    # resent copies of them do not (19-33 of 50-89 in order, 25-43 reordering)
    assert fast["full_path"] < slow["full_path"] * (2 / 3 if reorder_ns else 1 / 2)
    del fast["full_path"], slow["full_path"]
    assert fast == slow
    assert fast["responder"][4]["delivered"] > 20  # the stream was mostly delivered
    # the records say each PSN was delivered once: in order at once, or once its gap filled
    delivered = sorted(p[2] for p in fast["packets"] if p[8] == 1)
    assert delivered == list(range(fast["responder"][0]))
    if reorder_ns:  # gaps were filled from packets placed ahead, not NAKed
        assert fast["responder"][4]["placed_ahead"] > 0 and fast["responder"][4]["naks_sent"] == 0


def test_the_icrc_path_computes_zlibs_crc32_at_every_length():
    from traffic import _nicio
    rng = random.Random(5)
    for n in list(range(0, 200)) + [4095, 4096, 4097, 4170, 9000]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        seed = rng.getrandbits(32)
        assert _nicio.crc32(data, seed) == zlib.crc32(data, seed), n
