"""The switch-queue emulator: its process (emulator) acts on the queues' backlogs as real
switches do (ECN, PFC, load); what it records (record) and tells others (messages) beside it;
the runner's side (handle) and their contract."""
