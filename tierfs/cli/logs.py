"""Logging as gcsfuse's ``logging:*`` options describe it.

Severity ``trace|debug|info|warning|error|off``; format ``json`` (one object
a line, gcsfuse's default) or ``text``; ``file-path`` with size-based
rotation (``log-rotate:*``); without a file, stderr in the foreground and
syslog in the background (where ``/dev/log`` exists), as gcsfuse does.
"""

from __future__ import annotations

import gzip
import json
import logging
import logging.handlers
import os
import shutil
import sys
import time

from mount_options import Config

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "severity": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


KEEP_ALL_BACKUPS = 9999  # "0 keeps all": the stdlib's 0 would never rotate at all


def _gzip_rotated(source: str, dest: str) -> None:
    with open(source, "rb") as plain, gzip.open(dest, "wb") as packed:
        shutil.copyfileobj(plain, packed)
    os.remove(source)


def rotating_file(
    path: str, *, max_bytes: int, backups: int, compress: bool
) -> logging.handlers.RotatingFileHandler:
    """gcsfuse's log rotation: a new file at ``max_bytes``, ``backups`` old ones kept
    (0: all), each gzipped as ``NAME.N.gz`` when ``compress``."""
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backups or KEEP_ALL_BACKUPS
    )
    if compress:
        handler.namer = lambda name: name + ".gz"
        handler.rotator = _gzip_rotated
    return handler


def setup(config: Config, *, foreground: bool) -> None:
    """Configure the ``tierfs`` logger from the logging options."""
    logger = logging.getLogger("tierfs")
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.setLevel(LEVELS[config["logging:severity"]])
    logger.propagate = False
    path = config["logging:file-path"]
    handler: logging.Handler
    if path:
        handler = rotating_file(
            path,
            max_bytes=config["logging:log-rotate:max-file-size-mb"] << 20,
            backups=config["logging:log-rotate:backup-file-count"],
            compress=config["logging:log-rotate:compress"],
        )
    elif foreground:
        handler = logging.StreamHandler(sys.stderr)
    elif os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
    else:
        handler = logging.NullHandler()
    if config["logging:format"] == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
