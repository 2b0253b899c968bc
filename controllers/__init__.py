"""OpenFlow switching policies (pure cores) and the thin os-ken app that applies them."""
