"""The data model every reader shares: the schedule and its verifier, one rank's plan, the
in-process emulator and the schedule in words."""
