"""AI-fabric testbed: leaf-spine fabrics in Mininet, os-ken policies, RoCEv2 all-reduce."""

__version__ = "0.1.0"
