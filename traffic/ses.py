"""UET's semantic sublayer at the receiver, as a pure state machine: the messages of one PDC
assembled from packets placed in any order.

RUD places every packet as it arrives (``traffic.pds``); which message a packet belongs to, and
how long that message is, the SES header of every packet says (message id, request length).
A message is delivered when the last of its packets is placed - whichever one that is -
and each packet counts once (the PDS receiver drops duplicates).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from . import roce


@dataclass
class Assembly:
    mtu: int
    missing: Dict[int, int] = field(default_factory=dict)  # message id -> packets to come
    _count: Dict[int, int] = field(default_factory=dict)  # request length -> its packets

    def packets(self, length: int) -> int:
        n = self._count.get(length)
        if n is None:
            n = self._count[length] = len(roce.packet_payloads(length, self.mtu))
        return n

    def on_packet(self, message_id: int, request_length: int) -> bool:
        """A packet of message ``message_id`` (``request_length`` bytes) was placed; True
        when it was the message's last one."""
        left = self.missing.get(message_id)
        if left is None:
            left = self.packets(request_length)
        left -= 1
        if left:
            self.missing[message_id] = left
            return False
        self.missing.pop(message_id, None)
        return True
