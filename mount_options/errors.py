"""The one error the option parsers raise.

Every way a user can get an option wrong (unknown name, bad value, conflicting
options, malformed config file) ends in an `OptionError` whose text is a single
line meant to be printed after ``tierfs: `` and nothing else: no traceback, no
nested cause. Callers exit with status 2 on it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class OptionError(ValueError):
    """A user-facing, one-line description of what is wrong with the options."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


def unknown(
    name: str,
    candidates: Iterable[str],
    *,
    normalize: Callable[[str], str] = str,
    what: str = "option",
) -> OptionError:
    """An error for an unknown name, suggesting the nearest valid one.

    Names are compared after ``normalize`` (so ``file_mode`` is near
    ``file-mode``); the suggestion is shown in its canonical spelling.
    """
    pool = {normalize(c): c for c in sorted(set(candidates))}
    close = difflib.get_close_matches(normalize(name), list(pool), n=1, cutoff=0.6)
    hint = f" (did you mean '{pool[close[0]]}'?)" if close else ""
    return OptionError(f"unknown {what} '{name}'{hint}")
