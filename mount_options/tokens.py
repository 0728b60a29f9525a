"""One comma-separated option token, as found in ``-o``, fstab and CSI mountOptions.

A token takes one of these shapes (gcsfuse ``internal/mount/flag.go`` and the
CSI sidecar's ``prepareMountArgs``):

* ``section:key:value``: the colon form, a config-file key with its value;
  the longest known path wins, so values may contain ``:`` (URLs);
* ``name`` or ``name=value``: a flag; the first ``=`` splits, ``_`` and ``-``
  are the same character, a bare bool means true;
* a kernel/FUSE option (``ro``, ``allow_other``, ``nodev``...), kept apart
  for the mount step;
* ``o=X`` (CSI) with X one of a few kernel options;
* one of mount(8)'s own words (``rw``, ``user``, ``auto``, ``_netdev``,
  ``nofail``, ``x-*``...), which mean nothing to the filesystem and are dropped.

Anything else is an unknown option and an error, never silently passed on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mount_options.config import FILE_RANK, FLAG_RANK, FUSE_OPTIONS, Assignment, typed
from mount_options.errors import OptionError, unknown
from mount_options.kinds import BoolKind
from mount_options.schema import INDEX, SCHEMA, Option, loosen

# Kernel and FUSE mount options tierfs passes to the mount. Value-less ones:
FUSE_FLAGS = frozenset(
    {
        "ro", "rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "atime", "noatime",
        "relatime", "norelatime", "strictatime", "nostrictatime", "diratime", "nodiratime",
        "lazytime", "nolazytime", "sync", "async", "dirsync", "allow_other", "allow_root",
        "default_permissions", "auto_unmount",
    }
)  # fmt: skip
# ... and those that take a value.
FUSE_VALUED = frozenset({"fsname", "subtype", "max_read", "blksize", "context", "fscontext",
                         "defcontext", "rootcontext"})  # fmt: skip
# mount(8)'s own words: meaningless to the filesystem (gcsfuse's mount helper drops them too).
DROPPED = frozenset({"user", "nouser", "users", "owner", "group", "auto", "noauto", "_netdev",
                     "no_netdev", "nofail", "defaults", "comment"})  # fmt: skip
# Kernel options libfuse 3 refuses for a FUSE mount (the mount failed with
# "fuse_session_new() failed", or mounted and never answered: max_read): accepted, as
# gcsfuse and the CSI driver accept them, and dropped with a warning. tierfs keeps no
# access times; the kernel picks FUSE's read size and block size itself.
WITHOUT_EFFECT = frozenset({"atime", "diratime", "relatime", "norelatime", "strictatime",
                            "lazytime", "nolazytime", "max_read", "blksize"})  # fmt: skip
# The only values CSI accepts in ``o=X``.
CSI_O_VALUES = frozenset({"exec", "noexec", "atime", "noatime", "sync", "async", "dirsync"})

_FUSE_BY_LOOSE = {loosen(name): name for name in FUSE_FLAGS | FUSE_VALUED}
_SECTION_PREFIXES = frozenset(
    ":".join(o.path.split(":")[:n])
    for o in SCHEMA
    if o.in_config
    for n in range(1, o.path.count(":") + 1)
)
_PATHS_LONGEST_FIRST = sorted((o for o in SCHEMA if o.in_config), key=lambda o: -len(o.path))


@dataclass
class Parsed:
    """What a set of tokens said: option assignments, kernel options and warnings."""

    assignments: list[Assignment] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Parsed) -> None:
        self.assignments.extend(other.assignments)
        self.warnings.extend(other.warnings)


def parse_option_string(text: str, source: str) -> Parsed:
    """Parse a whole ``-o`` string: comma separated tokens."""
    parsed = Parsed()
    for token in text.split(","):
        parsed.extend(parse_token(token, source))
    return parsed


def parse_token(token: str, source: str) -> Parsed:
    text = token.strip()
    if not text:
        return Parsed()
    colon = _colon_form(text)
    if colon is not None:
        colon_option, raw = colon
        value = _value(colon_option, raw, text)
        return Parsed([Assignment(colon_option.path, value, source, FILE_RANK)])
    name, has_value, raw = text.partition("=")
    name = name.strip()
    word = name.lower()
    if word == "o" and has_value:
        return _csi_o(raw.strip(), source)
    if word in DROPPED or loosen(word) in {loosen(d) for d in DROPPED} or word.startswith("x-"):
        return Parsed()
    option = INDEX.by_loose.get(loosen(name))
    if option is not None and option.path != FUSE_OPTIONS:
        if not has_value and not isinstance(option.kind, BoolKind):
            raise OptionError(f"option '{name}' needs a value ({name}=...)")
        value = typed(option, raw if has_value else "true")
        rank = FILE_RANK if ":" in name else FLAG_RANK
        return Parsed([Assignment(option.path, value, source, rank)])
    kernel = fuse_option(name, raw if has_value else None)
    if kernel is not None:
        return _kernel(kernel, source)
    raise _unknown(text if not has_value else name)


def fuse_option(name: str, value: str | None) -> str | None:
    """The canonical kernel option for ``name[=value]``, or None when it is not one."""
    canonical = _FUSE_BY_LOOSE.get(loosen(name.lower()))
    if canonical is None:
        return None
    if canonical in FUSE_FLAGS:
        if value is not None:
            raise OptionError(f"kernel option '{canonical}' takes no value")
        return canonical
    if not value:
        raise OptionError(f"kernel option '{canonical}' needs a value ({canonical}=...)")
    return f"{canonical}={value}"


def _colon_form(text: str) -> tuple[Option, str] | None:
    """Split ``section:key:value`` at the longest known path."""
    if ":" not in text:
        return None
    loose = loosen(text)
    for option in _PATHS_LONGEST_FIRST:
        head = option.path + ":"
        if loose.startswith(head):
            return option, text[len(head) :]
    return None


def _value(option: Option, raw: str, token: str) -> object:
    if raw == "" and isinstance(option.kind, BoolKind):
        return True
    return typed(option, raw)


def _csi_o(value: str, source: str) -> Parsed:
    if value not in CSI_O_VALUES:
        allowed = ", ".join(sorted(CSI_O_VALUES))
        raise OptionError(f"bad value '{value}' for option 'o': expected one of {allowed}")
    return _kernel(value, source)


def _kernel(option: str, source: str) -> Parsed:
    """A kernel option for the mount, or a warning for one that would fail it."""
    name = option.partition("=")[0]
    if name in WITHOUT_EFFECT:
        return Parsed(warnings=[f"kernel option '{name}' has no effect on a FUSE mount: ignored"])
    return Parsed([Assignment(FUSE_OPTIONS, (option,), source, FLAG_RANK)])


def _unknown(name: str) -> OptionError:
    """Name the unknown option as the user wrote it, without its value."""
    if ":" not in name:
        pool = [o.flag for o in SCHEMA] + sorted(FUSE_FLAGS | FUSE_VALUED)
        return unknown(name, pool, normalize=loosen)
    parts = name.split(":")
    option = INDEX.by_loose.get(loosen(parts[0]))
    if option is not None and not option.in_config:
        return OptionError(f"option '{parts[0]}' has no colon form: write {option.flag}=VALUE")
    depth = 1
    while depth < len(parts) and loosen(":".join(parts[:depth])) in _SECTION_PREFIXES:
        depth += 1
    if depth == 1 and len(parts) >= 3:
        depth = 2  # an unknown section: show section:key
    shown = ":".join(parts[:depth])
    return unknown(shown, [o.path for o in SCHEMA if o.in_config], normalize=loosen)
