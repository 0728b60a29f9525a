"""The frozen configuration every input form resolves into.

Each input form (CLI flags, ``-o``/fstab strings, CSI mount options and
volume attributes, the YAML config file) produces a list of `Assignment`s:
"this option got this value from that source". `resolve` applies them in
gcsfuse's precedence, then hands the result to `derive` for the values that
follow from others, and returns a `Config`.

Precedence (gcsfuse ``cmd/root.go``): a flag beats the config file, which
beats the built-in default. The CSI colon form (``metadata-cache:ttl-secs:-1``)
is how gcsfuse's CSI driver writes a config file, so it ranks with the config
file; the flag form of a mount option (``implicit-dirs``, ``uid=1001``) ranks
with flags. Within one rank, the later assignment wins.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mount_options import derive, kinds
from mount_options.errors import OptionError
from mount_options.schema import ACCEPTED, INDEX, SCHEMA, Option

DEFAULT = "default"
CONFIG_FILE = "config-file"
FLAG = "flag"
MOUNT_OPTION = "mount-option"
CSI_ATTRIBUTE = "csi-attribute"
SOURCES = (DEFAULT, CONFIG_FILE, FLAG, MOUNT_OPTION, CSI_ATTRIBUTE)

# Rank of an assignment: higher wins regardless of order.
FUSE_OPTIONS = "file-system:fuse-options"
FILE_RANK = 1
FLAG_RANK = 2


@dataclass(frozen=True)
class Assignment:
    """One option set to one typed value by one source."""

    path: str
    value: Any
    source: str
    rank: int


@dataclass(frozen=True)
class Setting:
    """The effective value of one option and where it came from."""

    value: Any
    source: str


@dataclass(frozen=True)
class Section:
    """Attribute access to one section: ``config.section('metadata-cache').ttl_secs``."""

    _values: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class Config:
    """The effective, validated options of one mount. Immutable."""

    settings: Mapping[str, Setting]
    bucket: str = ""
    mountpoint: str = ""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    assigned: frozenset[str] = field(default=frozenset(), compare=False)  # set by the user

    def __getitem__(self, path: str) -> Any:
        return self.settings[path].value

    def source(self, path: str) -> str:
        return self.settings[path].source

    @property
    def fuse_options(self) -> tuple[str, ...]:
        return tuple(self[FUSE_OPTIONS])

    def section(self, name: str) -> Section:
        values = {o.attr: self[o.path] for o in SCHEMA if o.section == name}
        if not values:
            raise KeyError(name)
        return Section(MappingProxyType(values))

    def explicit(self) -> Iterator[tuple[Option, Setting]]:
        """Options not at their default, in schema order."""
        for option in SCHEMA:
            setting = self.settings[option.path]
            if setting.source != DEFAULT:
                yield option, setting

    def to_json(self) -> dict[str, Any]:
        """The shape ``tierfs mount --dry-run`` prints."""
        options = {
            o.path: {
                "value": o.kind.to_json(self.settings[o.path].value),
                "source": self.settings[o.path].source,
            }
            for o in SCHEMA
        }
        return {
            "bucket": self.bucket,
            "mountpoint": self.mountpoint,
            "options": options,
            "fuse_options": list(self.fuse_options),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)


def typed(option: Option, raw: Any, *, from_text: bool = True) -> Any:
    """Turn a raw value into the option's kind, or raise a one-line OptionError."""
    try:
        value = (
            option.kind.parse(raw)
            if from_text and isinstance(raw, str)
            else option.kind.coerce(raw)
        )
    except ValueError as err:
        shown = raw if isinstance(raw, str) else _show(raw)
        raise OptionError(
            f"bad value '{shown}' for option '{option.path}': expected {err}"
        ) from None
    _check_limits(option, value, raw)
    return value


def _read_write(fuse: dict[str, str]) -> None:
    """``ro`` and ``rw`` from the command line or ``-o`` contradict each other; ``rw`` there
    next to ``ro`` from a config file is mount(8)'s default and yields (as in gcsfuse's
    helper, which drops ``rw`` so the config file wins). ``rw`` itself is the default and
    never reaches the kernel."""
    if "ro" in fuse and "rw" in fuse and CONFIG_FILE not in (fuse["ro"], fuse["rw"]):
        raise OptionError("options 'ro' and 'rw' contradict each other: give one")
    fuse.pop("rw", None)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring = 2, 4, 4, 60
_SHOWN.maxother = 60


def _show(raw: Any) -> str:
    """A bad value as the error shows it, bounded: a YAML alias bomb (a few lines that
    expand to millions of elements) made the full dump of it exhaust memory."""
    try:
        if isinstance(raw, list | tuple | dict | set | frozenset):
            return _SHOWN.repr(raw)
        return json.dumps(raw, default=str)  # (a scalar as YAML writes it: true, null)
    except (ValueError, TypeError, RecursionError):
        return f"<{type(raw).__name__}>"


def _check_limits(option: Option, value: Any, raw: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    low, high = option.minimum, option.maximum
    if (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            want = f"a value from {_num(low)} to {_num(high)}"
        elif low is not None:
            want = f"a value of at least {_num(low)}"
        else:
            want = f"a value of at most {_num(high)}"
        raise OptionError(f"bad value '{raw}' for option '{option.path}': expected {want}")


def _num(number: float | None) -> str:
    return str(int(number)) if number is not None and float(number).is_integer() else str(number)


def resolve(
    assignments: Iterable[Assignment],
    *,
    bucket: str = "",
    mountpoint: str = "",
    cpu_count: int = 2,
    absolute: Callable[[str], str] | None = None,
) -> Config:
    """Apply precedence, derive dependent values and validate across options.

    ``absolute`` makes a path value absolute (the caller's working directory, ``~``): the
    daemon leaves that directory once it serves, so a relative ``cache-dir`` would name
    another place for every later file. Passed in, because this package does no I/O."""
    winners: dict[str, tuple[int, int, Assignment]] = {}
    fuse: dict[str, str] = {}  # kernel option -> source
    fuse_source = DEFAULT
    warnings: list[str] = []
    for order, item in enumerate(assignments):
        option = INDEX.by_path[item.path]
        if option.deprecated:
            warnings.append(f"option '{option.path}' is deprecated: {option.deprecated}")
        if option.path == FUSE_OPTIONS:
            fuse.update(dict.fromkeys(item.value, item.source))
            fuse_source = item.source
            continue
        held = winners.get(item.path)
        if held is None or (item.rank, order) >= held[:2]:
            winners[item.path] = (item.rank, order, item)
    _read_write(fuse)
    settings: dict[str, Setting] = {o.path: Setting(o.default, DEFAULT) for o in SCHEMA}
    for path, (_, _, item) in winners.items():
        value = item.value
        if absolute is not None and value and INDEX.by_path[path].kind is kinds.PATH:
            value = absolute(value)
        settings[path] = Setting(value, item.source)
    if fuse:
        settings[FUSE_OPTIONS] = Setting(tuple(fuse), fuse_source)
        winners_fuse = {FUSE_OPTIONS}
    else:
        winners_fuse = set()
    explicit = frozenset(winners) | winners_fuse
    warnings.extend(derive.apply(settings, explicit, cpu_count=cpu_count, make=Setting))
    idle = [
        path
        for path in sorted(explicit)
        if INDEX.by_path[path].effect == ACCEPTED and not INDEX.by_path[path].deprecated
    ]
    if idle:
        warnings.append(f"accepted without effect in tierfs: {', '.join(idle)}")
    return Config(
        MappingProxyType(settings), bucket, mountpoint, tuple(dict.fromkeys(warnings)), explicit
    )
