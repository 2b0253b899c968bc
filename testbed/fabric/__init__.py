"""The emulated fabric: Mininet hosts and Open vSwitch bridges (network), every egress shaped
(shaping), the BPF programs on switch ports, kernel capabilities detected, the fabric split
over servers (cluster), queue counters, packet capture and the real-verbs endpoints (rxe)."""
