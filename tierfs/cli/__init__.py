"""The command line: tierfs mount/unmount/stats/sync/demo, the daemon's start, logging,
the emulator helper (docs/architecture.md)."""
