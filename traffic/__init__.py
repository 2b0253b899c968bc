"""RoCEv2 packets, collective schedules and the GPU traffic agent."""
