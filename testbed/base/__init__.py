"""The shared base every part of the testbed builds on, and the only part of ``testbed`` that
``controllers`` and ``traffic`` import: the one exception root (errors), typed schemas, the
fabric plan (topology), process helpers, whole-file writes, netlink messages, the per-hop
latency model and the ledger of what a run created."""
