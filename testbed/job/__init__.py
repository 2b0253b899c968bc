"""Training jobs: model, parallelism and placement as an iteration graph."""
