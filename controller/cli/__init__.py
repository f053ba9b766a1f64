"""The `lightrail` command: the composition root that wires the daemon, agents and emulator."""
