"""The one table of options.

Every option tierfs understands is declared exactly once, in one of the table's parts
(`options_general`, `options_fs_gcs`, `options_compat`, joined here in that order): its
colon path
(the YAML config key and the CSI colon form, ``metadata-cache:ttl-secs``), its
command-line flag (``metadata-cache-ttl-secs``), its kind, default, limits and
help. The CLI, ``-o``/fstab, CSI and config-file parsers, the help text and
the generated docs table all read this table, so they cannot disagree.

gcsfuse's names, defaults and meanings are kept as gcsfuse defines them, so a
gcsfuse option line means the same here. tierfs's own options carry
``tierfs=True`` and live under their own keys (``ram-cache:*``,
``write:write-back``, ``read-ahead-kb``, ``file-cache:passthrough``).

Options that gcsfuse accepts but that have no effect in tierfs (gRPC tuning,
Cloud Profiler, zonal buckets...) are still declared, so that a pasted gcsfuse
line never fails; ``effect`` says what tierfs does with them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from mount_options import options_compat, options_fs_gcs, options_general
from mount_options.option import ACCEPTED, USED, Option

__all__ = ["ACCEPTED", "INDEX", "SCHEMA", "USED", "Option", "loosen"]

SCHEMA: tuple[Option, ...] = (
    options_general.OPTIONS + options_fs_gcs.OPTIONS + options_compat.OPTIONS
)


class _Index:
    """Lookups into SCHEMA by path, by flag and by the loose names of ``-o`` strings."""

    def __init__(self, options: tuple[Option, ...]) -> None:
        self.by_path: Mapping[str, Option] = MappingProxyType({o.path: o for o in options})
        self.by_flag: Mapping[str, Option] = MappingProxyType({o.flag: o for o in options})
        loose: dict[str, Option] = {}
        for option in options:
            loose.setdefault(loosen(option.flag), option)
            loose.setdefault(loosen(option.path), option)
        self.by_loose: Mapping[str, Option] = MappingProxyType(loose)
        if len(self.by_path) != len(options) or len(self.by_flag) != len(options):
            raise AssertionError("duplicate option path or flag in SCHEMA")

    def names(self) -> Iterator[str]:
        """Every name a user may type, for 'did you mean' hints."""
        yield from self.by_path
        yield from self.by_flag


def loosen(name: str) -> str:
    """``-o``/fstab names treat ``_`` and ``-`` as the same character."""
    return name.strip().replace("_", "-")


INDEX = _Index(SCHEMA)
