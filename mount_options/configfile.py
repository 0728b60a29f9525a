"""The YAML config file (``--config-file``), with gcsfuse's nesting and strictness.

Keys nest by section (``metadata-cache: {ttl-secs: -1}``); a key gcsfuse
would not know is an error, as in gcsfuse (viper's ``ErrorUnused``), with
the nearest valid key suggested. The text is parsed here; reading the file is
the caller's job (this package does no I/O).
"""

from __future__ import annotations

from typing import Any

import yaml

from mount_options.config import CONFIG_FILE, FILE_RANK, FUSE_OPTIONS, Assignment, typed
from mount_options.errors import OptionError, unknown
from mount_options.schema import INDEX, SCHEMA
from mount_options.tokens import fuse_option


def _prefixes(path: str) -> list[str]:
    parts = path.split(":")
    return [":".join(parts[:n]) for n in range(1, len(parts))]


_SECTIONS = frozenset(p for o in SCHEMA if o.in_config for p in _prefixes(o.path))


def parse_config_file(text: str, name: str = "config file") -> list[Assignment]:
    """Assignments from the YAML text of a config file."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise OptionError(f"{name}{where}: {problem}") from None
    if document is None:
        return []
    if not isinstance(document, dict):
        raise OptionError(f"{name}: expected a mapping of options at the top level")
    assignments: list[Assignment] = []
    _walk(document, "", assignments, name)
    return assignments


def _walk(node: dict[Any, Any], prefix: str, out: list[Assignment], name: str) -> None:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in _SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise OptionError(f"{name}: '{path}' is a section and holds options, not a value")
            _walk(value, path + ":", out, name)
            continue
        option = INDEX.by_path.get(path)
        if option is None or not option.in_config:
            pool = [o.path for o in SCHEMA if o.in_config]
            raise OptionError(f"{name}: {unknown(path, pool, what='key')}")
        typed_value = typed(option, value, from_text=False)
        if option.path == FUSE_OPTIONS:
            typed_value = tuple(_kernel_option(item) for item in typed_value)
        out.append(Assignment(option.path, typed_value, CONFIG_FILE, FILE_RANK))


def _kernel_option(item: str) -> str:
    name, has_value, value = item.partition("=")
    kernel = fuse_option(name, value if has_value else None)
    if kernel is None:
        raise OptionError(f"unknown kernel option '{item}' in file-system:fuse-options")
    return kernel
