/* The GPU NIC's system-call edge in C: the same operations as traffic/nicio.py's pure-Python
 * ones, with the same results (tests/unit/test_nicio.py runs both), for the agent's hot path.
 *
 *   receive(fd, data, ctl, names, count, size, my_addr) -> list of tuples
 *       recvmmsg(2) of up to `count` RoCEv2 UDP payloads into the caller's buffers; each one
 *       parsed and its ICRC checked (nicio.py documents the tuple)
 *   receive_fast(..., my_addr, by_qpn, rank_by_addr, packets, rank, iterations, slack_ns,
 *                handler) -> datagrams read: as receive, but in arrival order each datagram
 *       that is the common case of traffic/agent.py's data path (the next in-order packet
 *       of a message, nothing to answer) is delivered here, exactly as that path would, and
 *       every other one passed to handler(*tuple)
 *   deliver_parsed(tuples, by_qpn, rank_by_addr, packets, rank, iterations, slack_ns,
 *                  handler) -> None: receive_fast's delivery of datagrams read earlier (as
 *       receive gives them; the delay line's release time in place of the kernel's)
 *   fill_send(fd, frame, psn_off, psn_word, reth_off, va, dlen, probe_off, tx_ns, iteration,
 *             step, crc_from, crc_end, crc_prefix, icrc_off) -> bytes sent, 0 if the socket
 *       would block: one RDMA WRITE template patched in place and sent
 *   stamps(fd, ctl, count) -> list of (key, kernel transmit ns) from the error queue
 *   stamps_join(fd, ctl, count, pending, log) -> (stamps read, last joined ns or -1, its
 *       frame's bytes): each stamp's frame popped from pending {key: (sent ns, bytes,
 *       kind)} and logged as (sent ns, kernel ns, bytes, kind)
 *   timer_arm(fd, when_ns) -> None: a timerfd armed at an absolute time (0: disarmed)
 *   crc32(data, crc=0) -> int: zlib.crc32's value, computed the way ICRCs are here
 *   wait(epfd, timeout_ns, maxevents) -> list of (fd, events): epoll_pwait2(2), a timeout in
 *       nanoseconds (the task's timer slack lets the kernel merge it with other timers)
 *
 * Layouts: <sys/socket.h>, <linux/errqueue.h>, <linux/net_tstamp.h>; ICRC as in traffic/roce.py
 * (IBTA RoCEv2 annex A17.4: CRC-32 over a pseudo-header with the variant fields set to ones).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <zlib.h>

#ifndef SO_TIMESTAMPNS
#define SO_TIMESTAMPNS 35
#endif
#ifndef SO_TIMESTAMPING
#define SO_TIMESTAMPING 37
#endif
#ifndef SO_RXQ_OVFL
#define SO_RXQ_OVFL 40
#endif
#ifndef SOL_PACKET
#define SOL_PACKET 263
#endif
#ifndef PACKET_TX_TIMESTAMP
#define PACKET_TX_TIMESTAMP 16
#endif

#define MAX_BATCH 64
#define BTH_LEN 12
#define RETH_LEN 16
#define ICRC_LEN 4
#define PROBE_LEN 16
#define ROCE_PORT 4791
#define PSN_MASK 0xffffff
#define RETX_FLAG 0x80000000u  /* traffic/agent.py: a retransmitted packet's step */
#define ECN_CE 3
#define WRITE_FIRST 0x06
#define WRITE_MIDDLE 0x07
#define WRITE_LAST 0x08
#define WRITE_ONLY 0x0a

enum { OK = 0, SHORT = 1, BAD_ICRC = 2 };

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32)); put_be32(p + 4, (uint32_t)v);
}

/* CRC-32 (zlib's: reflected, polynomial 0xEDB88320) of n bytes after `crc`. Where the CPU has
 * PCLMULQDQ, whole 16-byte blocks are folded with carry-less multiplication (Gopal, Ozturk et
 * al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009:
 * the bit-reflected constants and Barrett reduction of its appendix) and zlib does the rest;
 * elsewhere zlib does it all. `crc32` below (a test hook) checks it against zlib. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FOLD_MIN 64

__attribute__((target("pclmul,sse4.1")))
static uint32_t crc32_fold(const unsigned char *p, size_t n, uint32_t crc) {
    /* n >= 64, a multiple of 16; crc and result in the pre- and post-inverted domain */
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    for (; n >= 64; p += 64, n -= 64) {  /* four lanes, each folded 512 bits ahead */
        __m128i *lane[4] = {&a, &b, &c, &d};
        for (int i = 0; i < 4; i++) {
            __m128i x = *lane[i];
            *lane[i] = _mm_xor_si128(
                _mm_xor_si128(_mm_clmulepi64_si128(x, k1k2, 0x00),
                              _mm_clmulepi64_si128(x, k1k2, 0x11)),
                _mm_loadu_si128((const __m128i *)(p + 16 * i)));
        }
    }
    __m128i x = a;  /* the lanes into one, 128 bits at a time */
    const __m128i next[3] = {b, c, d};
    for (int i = 0; i < 3; i++)
        x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k3k4, 0x00),
                                        _mm_clmulepi64_si128(x, k3k4, 0x11)), next[i]);
    for (; n >= 16; p += 16, n -= 16)
        x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k3k4, 0x00),
                                        _mm_clmulepi64_si128(x, k3k4, 0x11)),
                          _mm_loadu_si128((const __m128i *)p));
    /* 128 -> 64 bits, then -> 32 by Barrett reduction */
    x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k3k4, 0x10));
    x = _mm_xor_si128(_mm_srli_si128(x, 4),
                      _mm_clmulepi64_si128(_mm_and_si128(x, low32), k5, 0x00));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x, t), 1);
}

static int have_fold = -1;

static uint32_t fast_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    if (have_fold < 0)
        have_fold = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    if (have_fold && n >= FOLD_MIN) {
        size_t whole = n & ~(size_t)15;
        crc = ~crc32_fold(p, whole, ~crc);
        p += whole;
        n -= whole;
    }
    return (uint32_t)crc32(crc, p, (uInt)n);
}
#else
static uint32_t fast_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    return (uint32_t)crc32(crc, p, (uInt)n);
}
#endif

static PyObject *crc32_hook(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &b, &crc)) return NULL;
    uint32_t v = fast_crc32(crc, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(v);
}

/* The ICRC of a UDP payload as a receiver sees it (traffic/roce.py payload_icrc_ok). */
static uint32_t payload_icrc(const unsigned char *d, size_t n, uint32_t src, uint32_t dst,
                             unsigned sport) {
    unsigned char p[8 + 20 + 8 + 8];
    unsigned total = 20 + 8 + (unsigned)n, udp_len = 8 + (unsigned)n;
    memset(p, 0xff, 8);
    unsigned char *ip = p + 8;
    ip[0] = 0x45; ip[1] = 0xff; ip[2] = total >> 8; ip[3] = total & 0xff;
    ip[4] = 0; ip[5] = 0; ip[6] = 0x40; ip[7] = 0; ip[8] = 0xff; ip[9] = 17;
    ip[10] = 0xff; ip[11] = 0xff;
    put_be32(ip + 12, src); put_be32(ip + 16, dst);
    unsigned char *udp = ip + 20;
    udp[0] = sport >> 8; udp[1] = sport & 0xff; udp[2] = ROCE_PORT >> 8; udp[3] = ROCE_PORT & 0xff;
    udp[4] = udp_len >> 8; udp[5] = udp_len & 0xff; udp[6] = 0xff; udp[7] = 0xff;
    unsigned char *bth = udp + 8;
    memcpy(bth, d, 8);
    bth[4] = 0xff;
    uLong crc = crc32(0L, p, sizeof p);
    return fast_crc32((uint32_t)crc, d + 8, n - 8 - ICRC_LEN);
}

/* One received datagram, parsed (nicio.py documents the fields). */
struct dgram {
    int status, tos, opcode, len;
    long long rx_ns, dropped, a, b, c, d;
    uint32_t addr, dqpn, word;
    unsigned sport;
};

/* recvmmsg(2) without blocking and without the GIL: the messages read, 0 if none was
 * waiting, -1 with a Python error set. */
static int recv_batch(int fd, struct mmsghdr *msgs, int count, int flags) {
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = recvmmsg(fd, msgs, count, flags | MSG_DONTWAIT, NULL);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return 0;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return n;
}

/* recvmmsg(2) of up to `count` datagrams into the caller's buffers, each parsed into `out`;
 * the number read (0: none waiting), -1 with a Python error set. */
static int recv_parse(int fd, Py_buffer *data, Py_buffer *ctl, Py_buffer *names, int count,
                      int size, uint32_t my_addr, struct dgram *out) {
    const int ctl_size = 128;
    if (data->len < (Py_ssize_t)count * size || ctl->len < (Py_ssize_t)count * ctl_size
            || names->len < (Py_ssize_t)count * 16) {
        PyErr_SetString(PyExc_ValueError, "buffers too small for the batch");
        return -1;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iovs[MAX_BATCH];
    memset(msgs, 0, sizeof(struct mmsghdr) * count);
    for (int i = 0; i < count; i++) {
        iovs[i].iov_base = (char *)data->buf + (size_t)i * size;
        iovs[i].iov_len = size;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = (char *)ctl->buf + (size_t)i * ctl_size;
        msgs[i].msg_hdr.msg_controllen = ctl_size;
        msgs[i].msg_hdr.msg_name = (char *)names->buf + (size_t)i * 16;
        msgs[i].msg_hdr.msg_namelen = 16;
    }
    int n = recv_batch(fd, msgs, count, 0);
    if (n <= 0) return n;
    for (int i = 0; i < n; i++) {
        struct msghdr *h = &msgs[i].msg_hdr;
        const unsigned char *d = iovs[i].iov_base;
        size_t len = msgs[i].msg_len;
        struct dgram *g = &out[i];
        memset(g, 0, sizeof *g);
        g->dropped = -1;
        g->len = (int)len;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                g->rx_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
                g->tos = *(unsigned char *)CMSG_DATA(c);
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
                uint32_t v;
                memcpy(&v, CMSG_DATA(c), sizeof v);
                g->dropped = v;
            }
        }
        struct sockaddr_in *sa = (struct sockaddr_in *)h->msg_name;
        g->addr = ntohl(sa->sin_addr.s_addr);
        g->sport = ntohs(sa->sin_port);
        if (len < BTH_LEN + ICRC_LEN) {
            g->status = SHORT;
            continue;
        }
        g->opcode = d[0];
        g->dqpn = be32(d + 4) & 0xffffff;
        g->word = be32(d + 8);
        uint32_t want = (uint32_t)d[len - 4] | ((uint32_t)d[len - 3] << 8)
                        | ((uint32_t)d[len - 2] << 16) | ((uint32_t)d[len - 1] << 24);
        if (payload_icrc(d, len, g->addr, my_addr, g->sport) != want) {
            g->status = BAD_ICRC;
        } else if (g->opcode == 0x11) {  /* ACKNOWLEDGE: the AETH */
            if (len >= BTH_LEN + 4 + ICRC_LEN) {
                g->a = d[12];
                g->b = ((uint32_t)d[13] << 16) | ((uint32_t)d[14] << 8) | d[15];
            } else {
                g->a = -1;
            }
        } else if (g->opcode == WRITE_FIRST || g->opcode == WRITE_MIDDLE
                   || g->opcode == WRITE_LAST || g->opcode == WRITE_ONLY) {
            size_t off = BTH_LEN + ((g->opcode == WRITE_FIRST || g->opcode == WRITE_ONLY)
                                    ? RETH_LEN : 0);
            long long payload = (long long)len - (long long)off - ICRC_LEN;
            if (payload >= PROBE_LEN) {
                g->a = (long long)be64(d + off);
                g->b = be32(d + off + 8);
                g->c = be32(d + off + 12);
            }
            g->d = payload;
        }
    }
    return n;
}

static PyObject *dgram_tuple(const struct dgram *g) {
    return Py_BuildValue("(iLiLkIiIILLLLi)", g->status, g->rx_ns, g->tos, g->dropped,
                         (unsigned long)g->addr, g->sport, g->opcode, (unsigned int)g->dqpn,
                         (unsigned int)g->word, g->a, g->b, g->c, g->d, g->len);
}

static PyObject *receive(PyObject *self, PyObject *args) {
    int fd, count, size;
    unsigned int my_addr;
    Py_buffer data, ctl, names;
    if (!PyArg_ParseTuple(args, "iw*w*w*iiI", &fd, &data, &ctl, &names, &count, &size, &my_addr))
        return NULL;
    if (count > MAX_BATCH) count = MAX_BATCH;
    struct dgram got[MAX_BATCH];
    PyObject *out = NULL;
    int n = recv_parse(fd, &data, &ctl, &names, count, size, my_addr, got);
    if (n >= 0 && (out = PyList_New(n)) != NULL) {
        for (int i = 0; i < n; i++) {
            PyObject *t = dgram_tuple(&got[i]);
            if (!t) { Py_CLEAR(out); break; }
            PyList_SET_ITEM(out, i, t);
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&ctl);
    PyBuffer_Release(&names);
    return out;
}

/* Attribute names of traffic/agent.py's QueuePair and traffic/rc.py's Responder. */
static PyObject *s_peer, *s_resp, *s_in_order_only, *s_epsn, *s_unacked, *s_ack_every,
    *s_nak_sent, *s_counters, *s_delivered;

static int get_long(PyObject *obj, PyObject *name, long long *v) {
    PyObject *x = PyObject_GetAttr(obj, name);
    if (!x) return -1;
    *v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_long(PyObject *obj, PyObject *name, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    int r = PyObject_SetAttr(obj, name, x);
    Py_DECREF(x);
    return r;
}

/* The common case of a data packet, as traffic/rnic.py's Rnic.receive and rc.Responder handle
 * it: the next PSN of a QP's message, not its last packet, no ACK due, no CE mark, a valid
 * probe. Delivered here (the responder's state advanced, the packet recorded); 1 if so, 0 if
 * the packet needs the full path, -1 on a Python error. */
static int deliver_in_order(const struct dgram *g, PyObject *by_qpn, PyObject *rank_by_addr,
                            PyObject *packets, long long rank, long long iterations,
                            long long slack_ns) {
    if (g->status != OK || g->rx_ns == 0 || g->dropped >= 0
            || (g->opcode != WRITE_FIRST && g->opcode != WRITE_MIDDLE)
            || g->d < PROBE_LEN || (g->tos & ECN_CE) == ECN_CE || (g->word >> 31)
            || g->a <= 0 || g->a > g->rx_ns + slack_ns || g->b >= iterations)
        return 0;
    PyObject *key = PyLong_FromUnsignedLong(g->dqpn);
    if (!key) return -1;
    PyObject *qp = PyDict_GetItemWithError(by_qpn, key);  /* borrowed */
    Py_DECREF(key);
    if (!qp) return PyErr_Occurred() ? -1 : 0;
    long long peer, from = -1;
    if (get_long(qp, s_peer, &peer) < 0) return -1;
    key = PyLong_FromUnsignedLong(g->addr);
    if (!key) return -1;
    PyObject *src = PyDict_GetItemWithError(rank_by_addr, key);
    Py_DECREF(key);
    if (!src) return PyErr_Occurred() ? -1 : 0;
    from = PyLong_AsLongLong(src);
    if (from == -1 && PyErr_Occurred()) return -1;
    if (from != peer) return 0;
    PyObject *resp = PyObject_GetAttr(qp, s_resp);
    if (!resp) return -1;
    int r = -1;
    long long in_order_only, epsn, unacked, every, psn = g->word & PSN_MASK;
    if (get_long(resp, s_in_order_only, &in_order_only) < 0 || get_long(resp, s_epsn, &epsn) < 0
            || get_long(resp, s_unacked, &unacked) < 0 || get_long(resp, s_ack_every, &every) < 0)
        goto out;
    r = 0;
    /* reordering places packets ahead; go-back-0 keeps which PSNs were placed before */
    if (!in_order_only || psn != epsn || unacked + 1 >= every) goto out;
    r = -1;
    PyObject *counters = PyObject_GetAttr(resp, s_counters);
    if (!counters) goto out;
    PyObject *was = PyDict_GetItemWithError(counters, s_delivered);
    long long delivered = was ? PyLong_AsLongLong(was) : 0;
    if ((!was && PyErr_Occurred()) || (delivered == -1 && PyErr_Occurred())) {
        Py_DECREF(counters);
        goto out;
    }
    PyObject *now_delivered = PyLong_FromLongLong(delivered + 1);
    int bad = !now_delivered || PyDict_SetItem(counters, s_delivered, now_delivered) < 0;
    Py_XDECREF(now_delivered);
    Py_DECREF(counters);
    if (bad || set_long(resp, s_epsn, (epsn + 1) & PSN_MASK) < 0
            || PyObject_SetAttr(resp, s_nak_sent, Py_False) < 0
            || set_long(resp, s_unacked, unacked + 1) < 0)
        goto out;
    PyObject *row = Py_BuildValue("(LLLLLLLLiii)", peer, rank, psn, g->d, g->a, g->rx_ns, g->b,
                                  g->c & ~RETX_FLAG, g->tos & ECN_CE, 1,
                                  (g->c & RETX_FLAG) ? 1 : 0);
    if (!row) goto out;
    bad = PyList_Append(packets, row) < 0;
    Py_DECREF(row);
    r = bad ? -1 : 1;
out:
    Py_DECREF(resp);
    return r;
}

/* One datagram the fast way, or else to handler(*tuple) (`t`: its tuple if the caller has
 * it); 0, or -1 on a Python error. */
static int deliver_one(const struct dgram *g, PyObject *t, PyObject *by_qpn,
                       PyObject *rank_by_addr, PyObject *packets, long long rank,
                       long long iterations, long long slack_ns, PyObject *handler) {
    int r = deliver_in_order(g, by_qpn, rank_by_addr, packets, rank, iterations, slack_ns);
    if (r != 0) return r < 0 ? -1 : 0;
    PyObject *own = t ? NULL : dgram_tuple(g);
    if (!t && !own) return -1;
    PyObject *res = PyObject_Call(handler, t ? t : own, NULL);
    Py_XDECREF(own);
    if (!res) return -1;
    Py_DECREF(res);
    return 0;
}

static PyObject *receive_fast(PyObject *self, PyObject *args) {
    int fd, count, size;
    unsigned int my_addr;
    long long rank, iterations, slack_ns;
    Py_buffer data, ctl, names;
    PyObject *by_qpn, *rank_by_addr, *packets, *handler;
    if (!PyArg_ParseTuple(args, "iw*w*w*iiIO!O!O!LLLO", &fd, &data, &ctl, &names, &count,
                          &size, &my_addr, &PyDict_Type, &by_qpn, &PyDict_Type, &rank_by_addr,
                          &PyList_Type, &packets, &rank, &iterations, &slack_ns, &handler))
        return NULL;
    if (count > MAX_BATCH) count = MAX_BATCH;
    struct dgram got[MAX_BATCH];
    PyObject *out = NULL;
    int n = recv_parse(fd, &data, &ctl, &names, count, size, my_addr, got);
    if (n < 0) goto done;
    for (int i = 0; i < n; i++)  /* in arrival order, each the fast way or the handler's */
        if (deliver_one(&got[i], NULL, by_qpn, rank_by_addr, packets, rank, iterations,
                        slack_ns, handler) < 0)
            goto done;
    out = PyLong_FromLong(n);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&ctl);
    PyBuffer_Release(&names);
    return out;
}

static PyObject *deliver_parsed(PyObject *self, PyObject *args) {
    long long rank, iterations, slack_ns;
    PyObject *items, *by_qpn, *rank_by_addr, *packets, *handler;
    if (!PyArg_ParseTuple(args, "O!O!O!O!LLLO", &PyList_Type, &items, &PyDict_Type, &by_qpn,
                          &PyDict_Type, &rank_by_addr, &PyList_Type, &packets, &rank,
                          &iterations, &slack_ns, &handler))
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *t = PyList_GET_ITEM(items, i);  /* borrowed */
        struct dgram g;
        unsigned long addr;
        unsigned int dqpn, word;
        memset(&g, 0, sizeof g);
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iLiLkIiIILLLLi", &g.status, &g.rx_ns,
                &g.tos, &g.dropped, &addr, &g.sport, &g.opcode, &dqpn, &word, &g.a, &g.b,
                &g.c, &g.d, &g.len)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a datagram tuple");
            return NULL;
        }
        g.addr = (uint32_t)addr;
        g.dqpn = dqpn;
        g.word = word;
        if (deliver_one(&g, t, by_qpn, rank_by_addr, packets, rank, iterations, slack_ns,
                        handler) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *fill_send(PyObject *self, PyObject *args) {
    int fd, psn_off, reth_off, probe_off, crc_from, crc_end, icrc_off;
    unsigned int psn_word, dlen, iteration, step, crc_prefix;
    unsigned long long va, tx_ns;
    Py_buffer frame;
    if (!PyArg_ParseTuple(args, "iw*iIiKIiKIIiiIi", &fd, &frame, &psn_off, &psn_word, &reth_off,
                          &va, &dlen, &probe_off, &tx_ns, &iteration, &step, &crc_from,
                          &crc_end, &crc_prefix, &icrc_off))
        return NULL;
    unsigned char *buf = frame.buf;
    if (icrc_off + ICRC_LEN > frame.len || crc_end > frame.len || probe_off + PROBE_LEN > frame.len
            || psn_off + 4 > frame.len || (reth_off >= 0 && reth_off + RETH_LEN > frame.len)) {
        PyBuffer_Release(&frame);
        PyErr_SetString(PyExc_ValueError, "field offsets beyond the frame");
        return NULL;
    }
    put_be32(buf + psn_off, psn_word);
    if (reth_off >= 0) {
        put_be64(buf + reth_off, va);
        put_be32(buf + reth_off + 12, dlen);
    }
    put_be64(buf + probe_off, tx_ns);
    put_be32(buf + probe_off + 8, iteration);
    put_be32(buf + probe_off + 12, step);
    uint32_t crc = fast_crc32(crc_prefix, buf + crc_from, (size_t)(crc_end - crc_from));
    buf[icrc_off] = crc; buf[icrc_off + 1] = crc >> 8;
    buf[icrc_off + 2] = crc >> 16; buf[icrc_off + 3] = crc >> 24;
    ssize_t sent;
    Py_BEGIN_ALLOW_THREADS
    sent = send(fd, buf, (size_t)frame.len, MSG_DONTWAIT);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&frame);
    if (sent < 0) {
        if (errno == EAGAIN || errno == ENOBUFS) return PyLong_FromLong(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

/* Every transmit timestamp waiting on `fd`'s error queue, in order, to on_stamp(key, ns, ctx);
 * 0, or -1 with a Python error set (by recvmmsg, or by on_stamp returning -1). */
static int read_stamps(int fd, Py_buffer *ctl, int count,
                       int (*on_stamp)(long long, long long, void *), void *ctx) {
    const int ctl_size = 256;
    if (count > MAX_BATCH) count = MAX_BATCH;
    if (ctl->len < (Py_ssize_t)count * ctl_size) {
        PyErr_SetString(PyExc_ValueError, "control buffer too small");
        return -1;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iovs[MAX_BATCH];
    unsigned char scratch[MAX_BATCH][64];
    for (;;) {
        memset(msgs, 0, sizeof(struct mmsghdr) * count);
        for (int i = 0; i < count; i++) {
            iovs[i].iov_base = scratch[i];
            iovs[i].iov_len = sizeof scratch[i];
            msgs[i].msg_hdr.msg_iov = &iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = (char *)ctl->buf + (size_t)i * ctl_size;
            msgs[i].msg_hdr.msg_controllen = ctl_size;
        }
        int n = recv_batch(fd, msgs, count, MSG_ERRQUEUE);
        if (n <= 0) return n;
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &msgs[i].msg_hdr;
            long long ts = -1, key = -1;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
                    struct timespec t[3];
                    memcpy(t, CMSG_DATA(c), sizeof t);
                    ts = (long long)t[0].tv_sec * 1000000000LL + t[0].tv_nsec;
                } else if (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_TX_TIMESTAMP) {
                    struct sock_extended_err e;
                    memcpy(&e, CMSG_DATA(c), sizeof e);
                    if (e.ee_origin == SO_EE_ORIGIN_TIMESTAMPING) key = e.ee_data;
                }
            }
            if (ts >= 0 && key >= 0 && on_stamp(key, ts, ctx) < 0) return -1;
        }
        if (n < count) return 0;
    }
}

static int append_stamp(long long key, long long ts, void *ctx) {
    PyObject *t = Py_BuildValue("(LL)", key, ts);
    int r = t ? PyList_Append((PyObject *)ctx, t) : -1;
    Py_XDECREF(t);
    return r;
}

static PyObject *stamps(PyObject *self, PyObject *args) {
    int fd, count;
    Py_buffer ctl;
    if (!PyArg_ParseTuple(args, "iw*i", &fd, &ctl, &count)) return NULL;
    PyObject *out = PyList_New(0);
    if (out && read_stamps(fd, &ctl, count, append_stamp, out) < 0) Py_CLEAR(out);
    PyBuffer_Release(&ctl);
    return out;
}

/* stamps_join: each stamp's frame, (sent ns, bytes, kind) popped from `pending` by its key,
 * goes to `log` as (sent ns, kernel ns, bytes, kind) - traffic/nicio.py Stamps.join. */
struct join {
    PyObject *pending, *log;
    long long stamps, last_ts, last_bytes;
};

static int join_stamp(long long key, long long ts, void *ctx) {
    struct join *j = ctx;
    j->stamps++;
    PyObject *k = PyLong_FromLongLong(key);
    if (!k) return -1;
    PyObject *sent = PyDict_GetItemWithError(j->pending, k);  /* borrowed */
    if (!sent) {
        Py_DECREF(k);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!PyTuple_Check(sent) || PyTuple_GET_SIZE(sent) != 3) {
        Py_DECREF(k);
        PyErr_SetString(PyExc_ValueError, "a pending frame is not (sent ns, bytes, kind)");
        return -1;
    }
    PyObject *row = Py_BuildValue("(OLOO)", PyTuple_GET_ITEM(sent, 0), ts,
                                  PyTuple_GET_ITEM(sent, 1), PyTuple_GET_ITEM(sent, 2));
    long long bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(sent, 1));
    int r = (!row || (bytes == -1 && PyErr_Occurred()) || PyList_Append(j->log, row) < 0
             || PyDict_DelItem(j->pending, k) < 0) ? -1 : 0;
    Py_XDECREF(row);
    Py_DECREF(k);
    j->last_ts = ts;
    j->last_bytes = bytes;
    return r;
}

static PyObject *stamps_join(PyObject *self, PyObject *args) {
    int fd, count;
    Py_buffer ctl;
    struct join j = {NULL, NULL, 0, -1, 0};
    if (!PyArg_ParseTuple(args, "iw*iO!O!", &fd, &ctl, &count, &PyDict_Type, &j.pending,
                          &PyList_Type, &j.log))
        return NULL;
    int r = read_stamps(fd, &ctl, count, join_stamp, &j);
    PyBuffer_Release(&ctl);
    if (r < 0) return NULL;
    return Py_BuildValue("(LLL)", j.stamps, j.last_ts, j.last_bytes);
}

static PyObject *timer_arm(PyObject *self, PyObject *args) {
    int fd;
    long long when_ns;
    if (!PyArg_ParseTuple(args, "iL", &fd, &when_ns)) return NULL;
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    if (when_ns > 0) {
        spec.it_value.tv_sec = when_ns / 1000000000LL;
        spec.it_value.tv_nsec = when_ns % 1000000000LL;
    }
    if (timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *wait(PyObject *self, PyObject *args) {
    int epfd, maxevents;
    long long timeout_ns;
    if (!PyArg_ParseTuple(args, "iLi", &epfd, &timeout_ns, &maxevents)) return NULL;
    struct epoll_event events[64];
    if (maxevents > 64) maxevents = 64;
    struct timespec t, *tp = NULL;
    if (timeout_ns >= 0) {
        t.tv_sec = timeout_ns / 1000000000LL;
        t.tv_nsec = timeout_ns % 1000000000LL;
        tp = &t;
    }
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = epoll_pwait2(epfd, events, maxevents, tp, NULL);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        if (errno == EINTR) return PyList_New(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *e = Py_BuildValue("(iI)", events[i].data.fd, events[i].events);
        if (!e) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, e);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"wait", wait, METH_VARARGS,
     "epoll_pwait2: ready (fd, events) of an epoll set, waiting at most timeout_ns (-1: no limit)"},
    {"timer_arm", timer_arm, METH_VARARGS, "arm a timerfd at an absolute time (0: disarm)"},
    {"receive", receive, METH_VARARGS, "recvmmsg and parse RoCEv2 UDP payloads"},
    {"receive_fast", receive_fast, METH_VARARGS,
     "receive, delivering in-order data packets in C and the others to a handler"},
    {"deliver_parsed", deliver_parsed, METH_VARARGS,
     "receive_fast's delivery of datagrams already read (the RNIC's delay line)"},
    {"fill_send", fill_send, METH_VARARGS, "patch an RDMA WRITE template and send it"},
    {"stamps", stamps, METH_VARARGS, "transmit timestamps from the error queue"},
    {"stamps_join", stamps_join, METH_VARARGS,
     "transmit timestamps joined to their pending frames: (stamps, last ns, its bytes)"},
    {"crc32", crc32_hook, METH_VARARGS, "CRC-32 as zlib.crc32, by the path the ICRC takes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nicio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nicio(void) {
    struct { PyObject **at; const char *name; } names[] = {
        {&s_peer, "peer"}, {&s_resp, "resp"}, {&s_in_order_only, "in_order_only"},
        {&s_epsn, "epsn"},
        {&s_unacked, "unacked"}, {&s_ack_every, "ack_every"}, {&s_nak_sent, "nak_sent"},
        {&s_counters, "counters"}, {&s_delivered, "delivered"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].at = PyUnicode_InternFromString(names[i].name))) return NULL;
    return PyModule_Create(&module);
}
