"""The FUSE adapter: pyfuse3's requests into core calls and back (docs/architecture.md)."""
