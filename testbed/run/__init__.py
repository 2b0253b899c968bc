"""One run: each policy's run (decided in ``testbed.plan``), the controller's and the agents'
processes, background traffic, and the runner that opens and closes all of it; the fidelity
monitor and the emulation cost measured while it ran."""
