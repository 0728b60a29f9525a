"""Command lines: ``tierfs mount [flags] BUCKET DIR`` and ``mount.tierfs BUCKET DIR -o ...``.

Flags follow gcsfuse (Go's pflag): ``--name=value``, ``--name value`` for
non-bool flags, a bare bool flag means true, single-dash long flags
(``-implicit-dirs``) are accepted, flags and positionals may interleave and
``--`` ends the flags. We are a little kinder than gcsfuse: ``_`` and ``-``
are the same in flag names and the colon path works as a flag name too
(``--metadata-cache:ttl-secs=-1``).

``-o`` takes the same comma-separated tokens as fstab (see `tokens`).

Callers may declare extra flags of their own (``--dry-run``); they are
returned apart and never reach the option schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mount_options.config import FLAG, FLAG_RANK, FUSE_OPTIONS, MOUNT_OPTION, Assignment, typed
from mount_options.errors import OptionError, unknown
from mount_options.kinds import BoolKind
from mount_options.schema import INDEX, SCHEMA, loosen
from mount_options.tokens import Parsed, parse_option_string


@dataclass
class CommandLine:
    """A parsed command line: options, positionals and the caller's own flags."""

    parsed: Parsed = field(default_factory=Parsed)
    positional: list[str] = field(default_factory=list)
    extras: dict[str, str | bool] = field(default_factory=dict)
    # Where each positional was in argv: the mountpoint is rewritten there, not wherever
    # the same word appears (``tierfs mount b mnt --only-dir mnt``).
    positional_at: list[int] = field(default_factory=list)

    def add_positional(self, arg: str, at: int) -> None:
        self.positional.append(arg)
        self.positional_at.append(at)


def parse_flags(argv: Sequence[str], extras: Mapping[str, bool] = {}) -> CommandLine:
    """Parse gcsfuse-style flags. ``extras`` maps the caller's flag names to 'takes a value'."""
    line = CommandLine()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            for at in range(i, len(args)):
                line.add_positional(args[at], at)
            break
        if not arg.startswith("-") or arg == "-":
            line.add_positional(arg, i - 1)
            continue
        body = arg.lstrip("-")
        name, has_value, value = body.partition("=")
        text = _option_string(arg, name, has_value, value, extras)
        if text is not None:
            if text == "" and arg == "-o":  # (only a bare -o takes the next argument:
                text = _next(args, i, arg)  # "-o=" swallowed the bucket name)
                i += 1
            line.parsed.extend(parse_option_string(text, MOUNT_OPTION))
            continue
        if name in extras:
            if extras[name]:
                if not has_value:
                    value = _next(args, i, arg)
                    i += 1
                line.extras[name] = value
            else:
                if has_value:
                    raise OptionError(f"flag '--{name}' takes no value")
                line.extras[name] = True
            continue
        option = INDEX.by_flag.get(name) or INDEX.by_loose.get(loosen(name))
        if option is None or option.path == FUSE_OPTIONS:
            pool = [f"--{o.flag}" for o in SCHEMA] + [f"--{e}" for e in extras]
            raise unknown(f"--{name}", pool, normalize=loosen)
        if not has_value:
            if isinstance(option.kind, BoolKind):
                value = "true"
            else:
                value = _next(args, i, arg)
                i += 1
        line.parsed.assignments.append(
            Assignment(option.path, typed(option, value), FLAG, FLAG_RANK)
        )
    return line


def _option_string(
    arg: str, name: str, has_value: str, value: str, extras: Mapping[str, bool]
) -> str | None:
    """The text of an ``-o`` flag ("" when it is in the next argument), or None."""
    if name == "o":
        return value if has_value else ""
    is_flag = name in extras or name in INDEX.by_flag or loosen(name) in INDEX.by_loose
    if arg.startswith("-o") and not arg.startswith("--") and not is_flag:
        return arg[2:]  # -oro,allow_other
    return None


def _next(args: list[str], i: int, flag: str) -> str:
    if i >= len(args):
        raise OptionError(f"flag '{flag}' needs a value")
    return args[i]


def parse_mount_helper(argv: Sequence[str], extras: Mapping[str, bool] = {}) -> CommandLine:
    """``mount.tierfs SPEC DIR [-sfnv] [-o OPTIONS]... [-t TYPE]``, as mount(8) calls helpers.

    mount(8) may pass ``-n`` (no mtab), ``-s`` (sloppy), ``-f`` (fake), ``-v``
    (verbose) and ``-t type``; they are accepted and reported in ``extras``.
    """
    line = CommandLine()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "-o" or (arg.startswith("-o") and not arg.startswith("--")):
            text = arg[2:] if len(arg) > 2 else _next(args, i, arg)
            i += 0 if len(arg) > 2 else 1
            line.parsed.extend(parse_option_string(text.lstrip("="), MOUNT_OPTION))
        elif arg in ("-t", "--types"):
            _next(args, i, arg)
            i += 1
        elif arg.startswith("--") and arg[2:].partition("=")[0] in extras:
            name, has_value, value = arg[2:].partition("=")
            if extras[name] and not has_value:
                value = _next(args, i, arg)
                i += 1
            line.extras[name] = value if extras[name] else True
        elif (
            len(arg) > 1
            and arg.startswith("-")
            and not arg.startswith("--")
            and set(arg[1:]) <= set("sfnvw")
        ):
            for letter in arg[1:]:
                line.extras[letter] = True
        elif arg.startswith("-"):
            raise OptionError(f"unknown flag '{arg}' for mount.tierfs (options go in -o)")
        else:
            line.add_positional(arg, i - 1)
    return line
