"""Logging as gcsfuse's ``logging:*`` options describe it.

Severity ``trace|debug|info|warning|error|off``; format ``json`` (one object
a line, gcsfuse's default) or ``text``; ``file-path`` with size-based
rotation (``log-rotate:*``); without a file, stderr in the foreground and
syslog in the background (where ``/dev/log`` exists), as gcsfuse does.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
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


def setup(config: Config, *, foreground: bool) -> None:
    """Configure the ``tierfs`` logger from the logging options."""
    logger = logging.getLogger("tierfs")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(LEVELS[config["logging:severity"]])
    logger.propagate = False
    path = config["logging:file-path"]
    handler: logging.Handler
    if path:
        handler = logging.handlers.RotatingFileHandler(
            path,
            maxBytes=config["logging:log-rotate:max-file-size-mb"] << 20,
            backupCount=config["logging:log-rotate:backup-file-count"],
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
