"""The mount-options language of tierfs: gcsfuse's, unchanged, plus tierfs's own keys.

Pure parsing and validation: this package imports nothing from tierfs and
does no I/O (the config file's text is read by a function the caller hands
in). Every input form ends in the same frozen `Config`:

* `parse_flags`: ``tierfs mount --implicit-dirs -o ro BUCKET DIR``;
* `parse_mount_helper`: ``mount.tierfs BUCKET DIR -o rw,implicit_dirs`` (fstab);
* `parse_option_string`: one ``-o`` string;
* `parse_volume`: a CSI volume's attributes and mount options;
* `parse_config_file`: the YAML config file;

then `load` (or `resolve`) applies precedence and derived values, and
`render` writes a config back as one option string.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mount_options.argv import CommandLine, parse_flags, parse_mount_helper
from mount_options.config import (
    CONFIG_FILE,
    CSI_ATTRIBUTE,
    DEFAULT,
    FLAG,
    MOUNT_OPTION,
    SOURCES,
    Assignment,
    Config,
    Setting,
    resolve,
)
from mount_options.configfile import parse_config_file
from mount_options.csi import CsiVolume, parse_volume
from mount_options.errors import OptionError
from mount_options.render import render
from mount_options.schema import INDEX, SCHEMA, Option
from mount_options.target import check_bucket_name
from mount_options.tokens import Parsed, parse_option_string

__all__ = [
    "CONFIG_FILE",
    "CSI_ATTRIBUTE",
    "DEFAULT",
    "FLAG",
    "INDEX",
    "MOUNT_OPTION",
    "SCHEMA",
    "SOURCES",
    "Assignment",
    "CommandLine",
    "Config",
    "CsiVolume",
    "Option",
    "OptionError",
    "Parsed",
    "Setting",
    "check_bucket_name",
    "load",
    "parse_config_file",
    "parse_flags",
    "parse_mount_helper",
    "parse_option_string",
    "parse_volume",
    "render",
    "resolve",
]


def load(
    parsed: Parsed,
    *,
    bucket: str = "",
    mountpoint: str = "",
    read_text: Callable[[str], str] | None = None,
    cpu_count: int = 2,
    absolute: Callable[[str], str] | None = None,
) -> Config:
    """Resolve parsed options, reading ``config-file`` (if one was named) with ``read_text``;
    path values are made absolute with ``absolute`` (see `resolve`).

    The config file's assignments go first, so that within the config-file
    rank the colon forms of mount options (which gcsfuse's CSI driver writes
    into a config file after the user's) win over it, and flags win over both.
    """
    paths = [a.value for a in parsed.assignments if a.path == "config-file" and a.value]
    if paths and absolute is not None:  # (``~`` too: fstab has no shell to expand it)
        paths = [absolute(str(path)) for path in paths]
    file_assignments: list[Assignment] = []
    if paths:
        if read_text is None:
            raise OptionError("a config file was named but cannot be read here")
        try:
            text = read_text(paths[-1])
        except OSError as err:
            raise OptionError(
                f"cannot read config file '{paths[-1]}': {err.strerror or err}"
            ) from None
        except UnicodeDecodeError:
            raise OptionError(f"cannot read config file '{paths[-1]}': not UTF-8 text") from None
        file_assignments = parse_config_file(text, name=f"config file '{paths[-1]}'")
    config = resolve(
        [*file_assignments, *parsed.assignments],
        bucket=bucket,
        mountpoint=mountpoint,
        cpu_count=cpu_count,
        absolute=absolute,
    )
    _check_app_name(config["app-name"])
    if parsed.warnings:
        warnings = tuple(dict.fromkeys([*parsed.warnings, *config.warnings]))
        config = dataclasses.replace(config, warnings=warnings)
    return config


def _check_app_name(name: str) -> None:
    """``app-name`` goes into the User-Agent header: a newline or a character outside
    printable ASCII passed here and failed the mount later as "cannot reach bucket:
    InvalidHeader" or a UnicodeEncodeError."""
    bad = next((c for c in name if not " " <= c <= "~"), None)
    if bad is not None:
        raise OptionError(
            f"bad value {name!r} for option 'app-name': expected printable ASCII "
            f"(it goes into the User-Agent header), not {bad!r}"
        )
