"""What a scenario becomes on this machine, decided before anything starts (pure): the checks
across keys (checks), each policy's run (policyrun: classes, ECN marking, hop delays, transport
settings, the job), who marks ECN (marking), placement over servers (placement) and the
traffic beside the job (background). The fabric, the switch-queue emulator and the runner
read the frozen ``PolicyRun`` they are handed."""
