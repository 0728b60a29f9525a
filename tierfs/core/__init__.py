"""The filesystem core: POSIX semantics on inodes over the Bucket protocol
(docs/architecture.md)."""
