"""Batched receive (``recvmmsg(2)``) for the agent's hot paths, through ctypes.

Python's ``socket.recvmsg`` reads one datagram per system call, allocates its bytes, a list
of ancillary tuples and an address tuple, and raises when the socket is empty. ``Batch``
reads up to ``count`` datagrams per call into buffers allocated once, and hands out views of
them: the data, the ancillary data (control messages) and the source address of each. An
empty socket is a count of 0, not an exception.

Layouts: <sys/socket.h> ``struct mmsghdr`` (x86-64 and aarch64: 64 bytes, ``msg_namelen`` at
8, ``msg_controllen`` at 40, ``msg_len`` at 56), ``struct cmsghdr`` (``len`` 8 bytes, level,
type; data 8-aligned), ``struct sockaddr_in``.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Iterator, Tuple

MSG_DONTWAIT = 0x40
MSG_ERRQUEUE = 0x2000
CMSG = struct.Struct("=QII")  # len, level, type
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(_Iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


MMSGHDR_SIZE = ctypes.sizeof(_Mmsghdr)
OFF_CONTROLLEN = _Msghdr.controllen.offset
OFF_LEN = _Mmsghdr.len.offset
_libc = ctypes.CDLL(None, use_errno=True)
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                      ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int


class Batch:
    """Up to ``count`` datagrams of at most ``size`` bytes per ``recv``, each with up to
    ``control`` bytes of ancillary data and (``name``) its source address."""

    def __init__(self, fd: int, count: int, size: int, control: int, name: bool = True,
                 flags: int = MSG_DONTWAIT):
        self.fd, self.count, self.size, self.control = fd, count, size, control
        self.flags = flags
        self.vec = (_Mmsghdr * count)()
        self.iovs = (_Iovec * count)()
        self.data = (ctypes.c_char * (count * size))()
        self.ctl = (ctypes.c_char * (count * control))()
        self.names = (ctypes.c_char * (count * 16))()
        base_d, base_c = ctypes.addressof(self.data), ctypes.addressof(self.ctl)
        base_n = ctypes.addressof(self.names)
        for i in range(count):
            self.iovs[i].base, self.iovs[i].len = base_d + i * size, size
            h = self.vec[i].hdr
            h.iov = ctypes.pointer(self.iovs[i])
            h.iovlen = 1
            h.control, h.controllen = base_c + i * control, control
            if name:
                h.name, h.namelen = base_n + i * 16, 16
        self.name = name
        self.raw = memoryview(self.vec).cast("B")
        self.pristine = bytes(self.raw)  # the lengths the kernel overwrites, as set here
        self.address = ctypes.addressof(self.vec)
        self.data_view = memoryview(self.data).cast("B")
        self.ctl_view = memoryview(self.ctl).cast("B")
        self.names_view = memoryview(self.names).cast("B")
        self.used = 0

    def recv(self) -> int:
        """Read what is waiting (at most ``count``); returns how many datagrams came."""
        if self.used:  # the kernel wrote the lengths of the last batch: restore them
            end = self.used * MMSGHDR_SIZE
            self.raw[:end] = self.pristine[:end]
        n = _recvmmsg(self.fd, self.address, self.count, self.flags, None)
        if n < 0:
            err = ctypes.get_errno()
            self.used = 0
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, f"recvmmsg: {os.strerror(err)}")
        self.used = n
        return n

    def datagram(self, i: int) -> memoryview:
        at = i * self.size
        return self.data_view[at:at + U32.unpack_from(self.raw, i * MMSGHDR_SIZE + OFF_LEN)[0]]

    def cmsgs(self, i: int) -> Iterator[Tuple[int, int, int]]:
        """(level, type, offset of the data in ``ctl_view``) of datagram ``i``'s control
        messages."""
        view = self.ctl_view
        at = i * self.control
        end = at + U64.unpack_from(self.raw, i * MMSGHDR_SIZE + OFF_CONTROLLEN)[0]
        while at + CMSG.size <= end:
            length, level, kind = CMSG.unpack_from(view, at)
            if length < CMSG.size:
                return
            yield level, kind, at + CMSG.size
            at += (length + 7) & ~7

    def source(self, i: int) -> memoryview:
        """The 8 bytes of datagram ``i``'s ``sockaddr_in`` after the family: port, address."""
        at = i * 16
        return self.names_view[at + 2:at + 8]
