"""The YAML config file (``--config-file``), with gcsfuse's nesting and strictness.

Keys nest by section (``metadata-cache: {ttl-secs: -1}``); a key gcsfuse
would not know is an error, as in gcsfuse (viper's ``ErrorUnused``), with
the nearest valid key suggested. The text is parsed here; reading the file is
the caller's job (this package does no I/O).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from mount_options.config import CONFIG_FILE, FILE_RANK, FUSE_OPTIONS, Assignment, typed
from mount_options.errors import OptionError, unknown
from mount_options.schema import INDEX, SCHEMA
from mount_options.tokens import fuse_option


class _Loader(yaml.SafeLoader):
    """YAML as gcsfuse's Go decoder reads it (YAML 1.2 style): only true/false are
    booleans (``severity: off`` stays the word "off") and a leading zero does not make
    an int octal (``file-mode: 0644`` is 644, which the octal kind reads as 0o644)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body.startswith(("0x", "0X")):
        return sign * int(body[2:], 16)
    if body.startswith(("0o", "0O")):
        return sign * int(body[2:], 8)
    if body.startswith(("0b", "0B")):
        return sign * int(body[2:], 2)
    if ":" in body:  # YAML 1.1 sexagesimal: keep it the way the 1.1 loader reads it
        return int(yaml.SafeLoader.construct_yaml_int(loader, node))
    return sign * int(body, 10)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _prefixes(path: str) -> list[str]:
    parts = path.split(":")
    return [":".join(parts[:n]) for n in range(1, len(parts))]


_SECTIONS = frozenset(p for o in SCHEMA if o.in_config for p in _prefixes(o.path))


def parse_config_file(text: str, name: str = "config file") -> list[Assignment]:
    """Assignments from the YAML text of a config file."""
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise OptionError(f"{name}{where}: {problem}") from None
    except RecursionError:  # (thousands of nested ``[``: the loader recurses per level)
        raise OptionError(f"{name}: nested too deeply") from None
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
        try:  # (a value's error names the file it is in, as a key's does)
            typed_value = typed(option, value, from_text=False)
            if option.path == FUSE_OPTIONS:
                typed_value = tuple(_kernel_option(item) for item in typed_value)
        except OptionError as err:
            raise OptionError(f"{name}: {err}") from None
        out.append(Assignment(option.path, typed_value, CONFIG_FILE, FILE_RANK))


def _kernel_option(item: str) -> str:
    name, has_value, value = item.partition("=")
    kernel = fuse_option(name, value if has_value else None)
    if kernel is None:
        raise OptionError(f"unknown kernel option '{item}' in file-system:fuse-options")
    return kernel
