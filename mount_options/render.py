"""A config written back as one canonical option string.

Every option not at its default becomes one colon-form token
(``metadata-cache:ttl-secs:-1``), in schema order; kernel options follow as
bare tokens (``ro``, ``allow_other``). The string parses back to the same
values (`tests/test_options_properties.py` holds us to that). Options whose
values the comma syntax cannot carry (a comma, surrounding blanks) make
`render` fail rather than write something that parses differently.
"""

from __future__ import annotations

from mount_options.config import FUSE_OPTIONS, Config
from mount_options.errors import OptionError


def render(config: Config) -> str:
    tokens: list[str] = []
    for option, setting in config.explicit():
        if option.path == "config-file":
            continue  # its values are already inlined
        if option.path == FUSE_OPTIONS:
            continue
        text = option.kind.render(setting.value)
        if "," in text or text != text.strip() or "\n" in text:
            raise OptionError(
                f"option '{option.path}' has a value that an option string cannot hold"
            )
        tokens.append(f"{option.path}:{text}")
    tokens.extend(config.fuse_options)
    return ",".join(tokens)
