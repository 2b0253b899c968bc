"""AI-fabric testbed: leaf-spine fabrics in Mininet, os-ken policies, RoCEv2 all-reduce."""

import os

__version__ = "0.1.0"
# the checkout (or installation) that holds the testbed, controllers and traffic packages
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
