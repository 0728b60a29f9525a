"""Log rotation as gcsfuse's ``logging:log-rotate:*`` options say: a new file at the size
limit, old files kept up to the count (0: all), gzipped when ``compress`` is on; where the
log goes without ``log-file`` (docs/options.md)."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

import mount_options
from tierfs.cli import logs
from tierfs.cli.logs import rotating_file


def fill(handler: logging.Handler, lines: int) -> None:
    logger = logging.getLogger(f"tierfs.test-rotation-{id(handler)}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for i in range(lines):
            logger.warning("line %04d %s", i, "x" * 80)
    finally:
        logger.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize("compress", [True, False])
def test_rotated_files_are_kept_to_the_count_and_gzipped_when_asked(
    tmp_path: Path, compress: bool
) -> None:
    log = tmp_path / "tierfs.log"
    fill(rotating_file(str(log), max_bytes=1000, backups=3, compress=compress), 200)
    rotated = sorted(p.name for p in tmp_path.iterdir() if p.name != "tierfs.log")
    suffix = ".gz" if compress else ""
    assert rotated == [f"tierfs.log.{n}{suffix}" for n in (1, 2, 3)]
    newest = tmp_path / f"tierfs.log.1{suffix}"
    text = gzip.decompress(newest.read_bytes()) if compress else newest.read_bytes()
    assert b"line 01" in text  # a real log file, whole lines
    assert log.stat().st_size <= 1000


def test_a_count_of_0_keeps_every_rotated_file(tmp_path: Path) -> None:
    log = tmp_path / "tierfs.log"
    fill(rotating_file(str(log), max_bytes=1000, backups=0, compress=True), 200)
    assert len(list(tmp_path.glob("tierfs.log.*.gz"))) >= 15  # ~20 KB in 1 KB files


@pytest.mark.parametrize(
    ("foreground", "dev_log", "kind"),
    [
        (True, False, logging.StreamHandler),
        (False, True, logging.handlers.SysLogHandler),
        (False, False, logging.NullHandler),  # what the log-file help says: set it there
    ],
)
def test_without_a_log_file_the_log_goes_to_stderr_or_syslog_else_nowhere(
    monkeypatch: pytest.MonkeyPatch, foreground: bool, dev_log: bool, kind: type
) -> None:
    monkeypatch.setattr(logs.os.path, "exists", lambda path: dev_log and path == "/dev/log")
    monkeypatch.setattr(logging.handlers.SysLogHandler, "__init__", lambda self, **kw: None)
    config = mount_options.load(mount_options.parse_flags([]).parsed)
    logger = logging.getLogger("tierfs")
    before = (list(logger.handlers), logger.level, logger.propagate)
    try:
        logs.setup(config, foreground=foreground)
        assert [type(h) for h in logger.handlers] == [kind]
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in before[0]:
            logger.addHandler(handler)
        logger.setLevel(before[1])
        logger.propagate = before[2]
