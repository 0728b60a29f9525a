"""What one option is (`Option`) and the shorthands its tables are written with.

The tables themselves are `mount_options.options_general`, `options_fs_gcs` and
`options_compat`; `mount_options.schema` joins them into the one `SCHEMA`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mount_options import kinds
from mount_options.kinds import Kind

# What tierfs does with an option that gcsfuse has.
USED = "used"  # tierfs implements it
ACCEPTED = "accepted"  # parsed and validated; no effect in tierfs (yet)


@dataclass(frozen=True)
class Option:
    """One option: its names, its type and what it means."""

    path: str
    kind: Kind
    default: Any
    help: str
    flag: str = ""
    hidden: bool = False
    deprecated: str = ""
    in_config: bool = True
    tierfs: bool = False
    effect: str = USED
    minimum: float | None = None
    maximum: float | None = None

    @property
    def section(self) -> str:
        return self.path.split(":", 1)[0] if ":" in self.path else ""

    @property
    def attr(self) -> str:
        """The snake_case field name inside its section (``ttl_secs``)."""
        key = self.path.split(":", 1)[1] if ":" in self.path else self.path
        return key.replace(":", "_").replace("-", "_")


def _opt(
    path: str,
    kind: Kind,
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    **extra: Any,
) -> Option:
    key = path.split(":", 1)[1] if ":" in path else path
    return Option(path, kind, default, help, flag=flag or key.replace(":", "-"), **extra)


_H: dict[str, Any] = {"hidden": True}
_A: dict[str, Any] = {"effect": ACCEPTED}
_HA: dict[str, Any] = {"hidden": True, "effect": ACCEPTED}
_B, _I, _F, _S, _P, _D = (
    kinds.BOOL,
    kinds.INT,
    kinds.FLOAT,
    kinds.STRING,
    kinds.PATH,
    kinds.DURATION,
)
_ANY_SIZE: dict[str, Any] = {"minimum": -1}
