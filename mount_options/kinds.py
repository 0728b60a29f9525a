"""Value kinds: how an option's text becomes a typed value and back.

Each kind has three faces:

* ``parse(text)``: the text a user typed on a command line, in an ``-o``
  string or a CSI attribute;
* ``coerce(value)``: a value that YAML already typed (``ttl-secs: -1`` is an
  int, ``file-mode: 644`` is an int that means octal 0644);
* ``render(value)``: the canonical text, chosen so that
  ``parse(render(v)) == v`` for every valid ``v``.

They raise ``ValueError`` with a short description of what was expected; the
caller adds the option's name and the offending value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

_TRUE = {"1", "t", "true", "yes", "y", "on"}
_FALSE = {"0", "f", "false", "no", "n", "off"}

# Numbers as gcsfuse's flags take them: ASCII digits, a sign, no "_" (`IntKind.parse`).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(ns|us|µs|ms|s|m|h)")


@dataclass(frozen=True)
class Kind:
    """Base kind: a plain string."""

    name: str = "string"
    expected: str = "a string"

    def parse(self, text: str) -> Any:
        return text

    def coerce(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.parse(value)
        if value is None:
            return self.parse("")
        if isinstance(value, bool | int | float):
            return self.parse(str(value))
        raise ValueError(self.expected)

    def render(self, value: Any) -> str:
        return str(value)

    def to_json(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class BoolKind(Kind):
    name: str = "bool"
    expected: str = "true or false"

    def parse(self, text: str) -> bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(self.expected)

    def coerce(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return self.parse(value)
        raise ValueError(self.expected)

    def render(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class IntKind(Kind):
    name: str = "int"
    expected: str = "an integer"

    def parse(self, text: str) -> int:
        # Digits 0-9 only, as gcsfuse's flags take them: Python's int() would also take
        # "1_000" and the digits of other scripts (Arabic-Indic ones), which no other
        # tool reads as a number.
        body = text.strip()
        if not _INTEGER.fullmatch(body):
            raise ValueError(self.expected)
        return int(body, 10)

    def coerce(self, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(self.expected)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return self.parse(value)
        raise ValueError(self.expected)


@dataclass(frozen=True)
class FloatKind(Kind):
    name: str = "float"
    expected: str = "a number"

    def parse(self, text: str) -> float:
        body = text.strip()
        if not _NUMBER.fullmatch(body):
            raise ValueError(self.expected)
        number = float(body)
        if not math.isfinite(number):
            raise ValueError(self.expected)
        return number

    def coerce(self, value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(self.expected)
        if isinstance(value, int | float):
            return self.parse(repr(float(value)))
        if isinstance(value, str):
            return self.parse(value)
        raise ValueError(self.expected)

    def render(self, value: Any) -> str:
        return repr(float(value))


@dataclass(frozen=True)
class DurationKind(Kind):
    """Go-style durations (``30s``, ``1m30s``, ``1500ms``), held as float seconds.

    A bare number is taken as seconds, which Go would refuse; being lenient
    here costs nothing and saves a round trip to the docs.
    """

    name: str = "duration"
    expected: str = "a duration such as 30s, 1m30s or 1500ms"

    def parse(self, text: str) -> float:
        body = text.strip()
        if not body:
            raise ValueError(self.expected)
        try:
            seconds = float(body)
        except ValueError:
            pass
        else:
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError(self.expected)
            return seconds
        sign = 1.0
        if body[0] in "+-":
            sign = -1.0 if body[0] == "-" else 1.0
            body = body[1:]
        pos = 0
        total = 0.0
        while pos < len(body):
            match = _DURATION_PART.match(body, pos)
            if not match:
                raise ValueError(self.expected)
            total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos == 0 or sign < 0 or not math.isfinite(total):
            raise ValueError(self.expected)
        return total

    def coerce(self, value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(self.expected)
        if isinstance(value, int | float):
            return self.parse(repr(float(value)))
        return super().coerce(value)

    def render(self, value: Any) -> str:
        seconds = float(value)
        if seconds.is_integer():
            return f"{int(seconds)}s"
        return f"{seconds!r}s"

    def to_json(self, value: Any) -> Any:
        return self.render(value)


@dataclass(frozen=True)
class OctalKind(Kind):
    """File modes: ``644``, ``0644`` and ``0o644`` all mean 0o644 (YAML ints too)."""

    name: str = "octal"
    expected: str = "an octal mode such as 0644"
    maximum: int = 0o777

    def parse(self, text: str) -> int:
        body = text.strip().lower()
        if body.startswith("0o"):
            body = body[2:]
        if not body or not set(body) <= set("01234567"):
            raise ValueError(self.expected)
        mode = int(body, 8)
        if mode > self.maximum:
            raise ValueError(f"{self.expected}, at most {self.maximum:04o}")
        return mode

    def coerce(self, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(self.expected)
        if isinstance(value, int):
            return self.parse(str(value))
        return super().coerce(value)

    def render(self, value: Any) -> str:
        return f"{value:04o}"

    def to_json(self, value: Any) -> Any:
        return self.render(value)


@dataclass(frozen=True)
class EnumKind(Kind):
    """One of a fixed set of words, compared without case."""

    name: str = "enum"
    choices: tuple[str, ...] = ()
    expected: str = ""

    def parse(self, text: str) -> str:
        word = text.strip().lower()
        if word not in self.choices:
            shown = " | ".join(c if c else '""' for c in self.choices)
            raise ValueError(f"one of {shown}")
        return word


@dataclass(frozen=True)
class ListKind(Kind):
    """A list of strings; on one line its items are separated by ``:``-free commas."""

    name: str = "list"
    expected: str = "a list of strings"

    def parse(self, text: str) -> tuple[str, ...]:
        return tuple(item.strip() for item in text.split(",") if item.strip())

    def coerce(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            return self.parse(value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(self.expected)

    def render(self, value: Any) -> str:
        return ",".join(value)

    def to_json(self, value: Any) -> Any:
        return list(value)


STRING = Kind()
PATH = Kind(name="path", expected="a path")
BOOL = BoolKind()
INT = IntKind()
FLOAT = FloatKind()
DURATION = DurationKind()
OCTAL = OctalKind()
LIST = ListKind()


def enum(*choices: str) -> EnumKind:
    return EnumKind(choices=tuple(choices))


_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?)$"
)
_QUANTITY_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_to_mb(text: str) -> int:
    """A Kubernetes quantity (``10Gi``, ``500M``, ``-1``) as the GKE driver turns it into MB.

    Binary suffixes divide by 2**20, everything else by 10**6; a negative
    quantity means "unlimited" and becomes -1.
    """
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError("a Kubernetes quantity such as 10Gi or 500Mi")
    number = float(match.group(1))
    if match.group(2):
        exponent = int(match.group(2)[1:])
        if exponent > 30:
            raise ValueError("a Kubernetes quantity such as 10Gi or 500Mi")
        number *= 10.0**exponent
        suffix = None
    else:
        suffix = match.group(3)
    if not math.isfinite(number):
        raise ValueError("a Kubernetes quantity such as 10Gi or 500Mi")
    if number < 0:
        return -1
    size_bytes = math.ceil(number * _QUANTITY_FACTORS[suffix])
    divisor = 2**20 if suffix and suffix.endswith("i") else 10**6
    return size_bytes // divisor
