"""A config written back as one canonical option string.

Every option the user set becomes one colon-form token
(``metadata-cache:ttl-secs:-1``), in schema order (derived values are left out:
parsing derives them again); kernel options follow as
bare tokens (``ro``, ``allow_other``). The string parses back to the same
values (`tests/test_options_properties.py` holds us to that). Options whose
values the comma syntax cannot carry (a comma, surrounding blanks) make
`render` fail rather than write something that parses differently.
"""

from __future__ import annotations

from mount_options.config import FUSE_OPTIONS, Config
from mount_options.errors import OptionError
from mount_options.schema import SCHEMA


def render(config: Config) -> str:
    tokens: list[str] = []
    for option in SCHEMA:
        if option.path not in config.assigned or option.path in ("config-file", FUSE_OPTIONS):
            continue  # values derived from others are derived again on parsing
        text = option.kind.render(config[option.path])
        if "," in text or text != text.strip() or "\n" in text:
            raise OptionError(
                f"option '{option.path}' has a value that an option string cannot hold"
            )
        # Command-line-only options have no colon form: they go as flags.
        tokens.append(f"{option.path}:{text}" if option.in_config else f"{option.flag}={text}")
    tokens.extend(config.fuse_options)
    return ",".join(tokens)
