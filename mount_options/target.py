"""What to mount: ``BUCKET``, ``BUCKET/PREFIX`` or ``gs://BUCKET[/PREFIX]``.

A prefix is the same as ``--only-dir``. Bucket names are checked against
GCS's naming rules here, so a typo fails with a clear line instead of a
404 from the server later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mount_options.config import FLAG, FLAG_RANK, Assignment
from mount_options.errors import OptionError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


@dataclass(frozen=True)
class Target:
    bucket: str
    prefix: str = ""

    def only_dir_assignment(self) -> Assignment:
        return Assignment("only-dir", self.prefix, FLAG, FLAG_RANK)


def parse_target(spec: str) -> Target:
    text = spec.strip()
    if text.startswith("gs://"):
        text = text[len("gs://") :]
    bucket, _, prefix = text.partition("/")
    if bucket == "_":
        raise OptionError("mounting all buckets ('_') is not supported: name one bucket")
    check_bucket_name(bucket)
    return Target(bucket, "/".join(part for part in prefix.split("/") if part))


def check_bucket_name(name: str) -> None:
    problem = ""
    if not _BUCKET.match(name):
        problem = (
            "3-222 characters of lowercase letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    elif any(len(part) > 63 for part in name.split(".")):
        problem = "at most 63 characters between dots"
    elif name.startswith("goog") or "google" in name or ".." in name:
        problem = "no 'goog' prefix, no 'google' inside and no '..'"
    elif re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", name):
        problem = "a name, not an IP address"
    if problem:
        raise OptionError(f"bad bucket name '{name}': expected {problem}")
