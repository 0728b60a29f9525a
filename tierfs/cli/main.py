"""The command line: ``tierfs COMMAND ...`` and the mount(8) helper ``mount.tierfs``.

Everything a user can get wrong ends here as one line on stderr and an exit
status: 2 for bad options or usage, 1 for a failure while doing the work.
No traceback reaches the user; ``TIERFS_DEBUG=1`` prints it for developers.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import IO, Any, TextIO, cast

import mount_options
from mount_options import CommandLine, Config, OptionError
from mount_options.docs import help_text
from mount_options.target import parse_target
from tierfs import __version__
from tierfs.cli import daemon
from tierfs.cli.mountpoint import MountError, canonical
from tierfs.storage.smallfile import read_small_file

PROG = "tierfs"
MOUNT_EXTRAS = {
    "dry-run": False,
    "help": False,
    "help-all": False,
    "csi-volume-attributes": True,
    "ready-fd": True,
}
HELPER_ONLY_FLAGS = {"-n", "-s", "-f", "-v", "-w", "-sn", "-ns"}

USAGE = f"""\
usage: {PROG} COMMAND [options]

commands:
  mount [options] BUCKET[/PREFIX] MOUNTPOINT   mount a bucket (gs://BUCKET also works)
  prefetch PATH...                             warm the tiers for files and directories
  stats [--json] MOUNTPOINT                    hits, misses and bytes per tier; GCS requests
  sync PATH                                    wait until what was written at PATH is in GCS
  unmount MOUNTPOINT                           upload pending writes, unmount, wait for the daemon
  demo                                         start the emulator, mount, show a short tour
  install-helper [--prefix DIR]                install /sbin/mount.tierfs for mount(8) and fstab
  csi --node-id NAME [--endpoint unix:///PATH] a Kubernetes CSI node plugin (docs/kubernetes.md)

Run '{PROG} mount --help' for the mount options; they are gcsfuse's, unchanged.
"""

MOUNT_USAGE = f"""\
usage: {PROG} mount [options] BUCKET[/PREFIX] MOUNTPOINT
       {PROG} mount --dry-run [options] BUCKET MOUNTPOINT   print the effective options as JSON
       mount.{PROG} BUCKET MOUNTPOINT -o OPTIONS [--dry-run]   (what mount -t {PROG} runs)

Options may be given as flags (--implicit-dirs, --metadata-cache-ttl-secs=-1, single dash too),
in -o strings (-o ro,implicit_dirs,metadata-cache:ttl-secs:-1), in a YAML --config-file, or
as CSI volume attributes (--csi-volume-attributes '{{"fileCacheCapacity": "10Gi"}}').
Precedence: flag > config file > default.
"""


# `tierfs COMMAND --help`: the command's line of USAGE (it was a usage error, status 2).
SUBCOMMAND_USAGE = {
    "stats": "stats [--json] MOUNTPOINT\n  hits, misses and bytes per tier; GCS requests",
    "sync": "sync PATH\n  wait until what was written at PATH is in GCS",
    "unmount": "unmount MOUNTPOINT\n  upload pending writes, unmount, wait for the daemon",
    "prefetch": "prefetch PATH...\n  warm the tiers for files and directories",
    "demo": "demo [--keep]\n  start the emulator, mount, show a short tour",
    "install-helper": "install-helper [--prefix DIR]\n  install /sbin/mount.tierfs (or in DIR)",
}
SUBCOMMAND_USAGE["umount"] = SUBCOMMAND_USAGE["unmount"]


class UsageError(Exception):
    """Wrong use of the command line itself (missing operands, unknown command)."""


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(_guarded(_main, list(sys.argv[1:] if argv is None else argv)))


def mount_helper_main(argv: Sequence[str] | None = None) -> None:
    """``mount.tierfs SPEC DIR -o OPTIONS``, the helper mount(8) runs for type tierfs."""
    sys.exit(_guarded(_mount_helper, list(sys.argv[1:] if argv is None else argv)))


class OutputError(OSError):
    """Writing to stdout failed (``tierfs --version > /dev/full``): the user's disk, not a
    bug of ours."""


class _Stdout:
    """``sys.stdout`` while a command runs, telling its write errors from all others."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError(err.errno, err.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError(err.errno, err.strerror) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _guarded(run: Callable[[list[str]], int], argv: list[str]) -> int:
    stdout = sys.stdout
    sys.stdout = cast(TextIO, _Stdout(stdout))
    try:
        status = run(argv)
        sys.stdout.flush()  # (a full disk is found here, not by the exit's silent flush)
        return status
    except (OptionError, UsageError) as err:
        print(f"{PROG}: {_one_line(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `tierfs --help | head`: the reader left; say nothing more
        _drop_stdout()
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except OutputError as err:
        _drop_stdout()
        print(f"{PROG}: cannot write output: {err.strerror or err}", file=sys.stderr)
        return 1
    except Exception as err:  # the last line of defence: one line, never a traceback
        daemon_log = logging.getLogger("tierfs")
        if daemon_log.handlers and not _logs_to_stderr(daemon_log):
            # A daemon, its log set up: the whole story goes there. In the foreground the
            # log is the terminal, which gets the one line below and no traceback.
            daemon_log.error("internal error, exiting: %s", err, exc_info=err)
        if os.environ.get("TIERFS_DEBUG"):
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(err).__name__}: {_one_line(err)}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _logs_to_stderr(logger: logging.Logger) -> bool:
    """Whether one of ``logger``'s handlers writes to this process's stderr (`--foreground`;
    a `FileHandler` is a `StreamHandler` too, on its own stream)."""
    return any(
        isinstance(h, logging.StreamHandler) and h.stream in (sys.stderr, sys.__stderr__)
        for h in logger.handlers
    )


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # (no real descriptor: a test's captured stdout)
        pass
    finally:
        os.close(devnull)


def _main(argv: list[str]) -> int:
    if not argv:  # (a usage error: the short usage, on stderr)
        print(USAGE, file=sys.stderr, end="")
        return 2
    if argv[0] in ("-h", "--help", "help", "--help-all"):
        print(USAGE)
        print(help_text(include_hidden=argv[0] == "--help-all"))
        return 0
    if argv[0] in ("-V", "--version", "version"):
        print(f"{PROG} {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command in SUBCOMMAND_USAGE and any(a in ("-h", "--help") for a in rest):
        print(f"usage: {PROG} {SUBCOMMAND_USAGE[command]}")
        return 0
    if command == "mount":
        line = mount_options.parse_flags(rest, MOUNT_EXTRAS)
        return _mount(line, ["mount", *rest], [at + 1 for at in line.positional_at])
    if command in ("unmount", "umount", "stats", "sync"):
        from tierfs.cli import commands

        run = {"stats": commands.stats, "sync": commands.sync}.get(command, commands.unmount)
        return run(rest)
    if command == "prefetch":
        from tierfs.cli.prefetch import prefetch

        return prefetch(rest)
    if command == "demo":
        from tierfs.cli.demo import run_demo

        return run_demo(rest)
    if command == "install-helper":  # mount(8) helper in /sbin: see tierfs/cli/install.py
        from tierfs.cli.install import main as install_helper_main

        return install_helper_main(rest)
    if command == "csi":  # the Kubernetes CSI node plugin: see tierfs/csi/
        from tierfs.csi import main as csi_main

        return csi_main(rest)
    raise UsageError(f"unknown command '{command}' (try '{PROG} --help')")


def _mount_helper(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(MOUNT_USAGE)
        print(help_text(include_hidden=False))
        return 0
    line = mount_options.parse_mount_helper(argv, MOUNT_EXTRAS)
    child: list[str] = ["mount"]
    moved: dict[int, int] = {}  # argv index -> child index
    skip = False
    for at, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in ("-t", "--types"):
            skip = True
        elif arg not in HELPER_ONLY_FLAGS:
            moved[at] = len(child)
            child.append(arg)
    places = [moved[i] for i in line.positional_at if i in moved]
    if len(line.positional) == 2 and line.positional[0].startswith("/") and places:
        # mount(8) makes a source that names an existing path absolute (``cd /mnt; mount
        # my-bucket``, with /mnt/my-bucket the mountpoint): gcsfuse's helper takes its last
        # part as the bucket, and so does this one.
        bucket = os.path.basename(line.positional[0].rstrip("/"))
        line.positional[0] = child[places[0]] = bucket
    if line.extras.get("f"):  # mount -f: everything but the mount itself
        effective_config(line)
        return 0
    return _mount(line, child, places)


def _mount(line: CommandLine, child_args: list[str], positional_at: list[int]) -> int:
    """``child_args``: the daemon's arguments; ``positional_at``: where in them the
    positionals are (the last is the mountpoint)."""
    if line.extras.get("help") or line.extras.get("help-all"):
        print(MOUNT_USAGE)
        print(help_text(include_hidden=bool(line.extras.get("help-all"))))
        return 0
    config = effective_config(line)
    for warning in config.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if line.extras.get("dry-run"):
        print(config.dumps())
        return 0
    ready_fd = line.extras.get("ready-fd")
    if config["foreground"] or isinstance(ready_fd, str):
        return run_foreground(config, int(ready_fd) if isinstance(ready_fd, str) else None)
    try:
        at = positional_at[-1] if positional_at else -1
        daemon.start_background(
            _absolute_mountpoint(child_args, at, config.mountpoint), config.mountpoint
        )
    except MountError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    return 0


def _absolute_mountpoint(args: list[str], at: int, absolute: str) -> list[str]:
    """The daemon's arguments with its mountpoint (``args[at]``, the last positional) made
    absolute: `tierfs unmount` finds the daemon by that path among its words in /proc, and
    did not find one mounted as ``mnt`` or ``/mnt/x/``: it returned while the daemon still
    uploaded what was pending. (Found by its place, not its value: a flag's value equal to
    it, ``--only-dir mnt``, was rewritten instead.)"""
    if not 0 <= at < len(args) or args[at] == absolute:
        return args
    return [*args[:at], absolute, *args[at + 1 :]]


def run_foreground(config: Config, ready_fd: int | None) -> int:
    """Serve the mount in this process; report readiness on ``ready_fd`` (the daemon's pipe)."""
    import trio

    from tierfs.cli import logs
    from tierfs.cli.memory import tune_allocator
    from tierfs.cli.readiness import say_progress
    from tierfs.mount import serve

    failures: list[str] = []

    said: list[bool] = []  # the final word is said: the pipe is closed (its number reused)

    def ready(message: str | None) -> None:
        said.append(True)
        if message is not None:
            failures.append(message)
        if ready_fd is not None:
            with os.fdopen(ready_fd, "w", encoding="utf-8") as pipe:
                pipe.write("ok\n" if message is None else message + "\n")
            os.chdir("/")
        elif message is not None:
            print(f"{PROG}: {message}", file=sys.stderr)

    try:
        logs.setup(config, foreground=ready_fd is None)
    except OSError as err:  # (a directory that is not there: not an internal error)
        path = config["logging:file-path"]
        ready(f"cannot write the log file {path} (log-file): {err.strerror or err}")
        return 1
    if ready_fd is not None:  # the terminal had them from the parent; the log gets them here
        for warning in config.warnings:
            logging.getLogger("tierfs").warning("%s", warning)
    tune_allocator(
        config["ram-cache:block-size-mb"] << 20, max(0, config["ram-cache:max-size-mb"]) << 20
    )

    def progress(what: str) -> None:
        if ready_fd is not None and not said:
            say_progress(ready_fd, what)

    trio.run(functools.partial(serve, config, ready, progress=progress))
    return 1 if failures else 0


def effective_config(line: CommandLine) -> Config:
    """Options from the command line, config file and CSI attributes, resolved."""
    parsed = line.parsed
    bucket_from_csi = ""
    attributes = line.extras.get("csi-volume-attributes")
    if isinstance(attributes, str):
        volume = mount_options.parse_volume(_json_object(attributes))
        volume.parsed.extend(parsed)  # command-line flags after, so they win
        parsed = volume.parsed
        bucket_from_csi = volume.bucket
    if len(line.positional) == 1 and bucket_from_csi:
        spec, mountpoint = bucket_from_csi, line.positional[0]
    elif len(line.positional) == 2:
        spec, mountpoint = line.positional
    elif len(line.positional) < 2:
        raise UsageError("give a bucket and a mountpoint: tierfs mount BUCKET MOUNTPOINT")
    else:
        extra = " ".join(line.positional[2:])
        raise UsageError(f"unexpected arguments after BUCKET MOUNTPOINT: {extra}")
    if not mountpoint:  # ("$MNT" unset: abspath("") is the working directory)
        raise UsageError("empty MOUNTPOINT: tierfs mount BUCKET MOUNTPOINT")
    target = parse_target(spec)
    if target.prefix:
        if any(a.path == "only-dir" for a in parsed.assignments):
            raise UsageError("give the prefix once: BUCKET/PREFIX or --only-dir, not both")
        parsed.assignments.append(target.only_dir_assignment())
    return mount_options.load(
        parsed,
        bucket=target.bucket,
        mountpoint=canonical(mountpoint),
        read_text=read_small_file,
        cpu_count=os.cpu_count() or 1,
        absolute=absolute_path,
    )


def absolute_path(path: str) -> str:
    """A path option as gcsfuse resolves it: ``~`` expanded, then against the working
    directory of the one who mounts (the daemon leaves it for ``/``)."""
    return os.path.abspath(os.path.expanduser(path))


def _json_object(text: str) -> dict[str, str]:
    """``--csi-volume-attributes``: the JSON itself, or ``@FILE`` (a small regular file)."""
    try:
        value = json.loads(read_small_file(text[1:]) if text.startswith("@") else text)
    except OSError as err:
        raise OptionError(
            f"bad value for --csi-volume-attributes: cannot read {text[1:]!r}: "
            f"{err.strerror or err}"
        ) from None
    except UnicodeDecodeError:
        raise OptionError("bad value for --csi-volume-attributes: not UTF-8 text") from None
    except (ValueError, RecursionError) as err:  # (JSONDecodeError; nesting past the limit)
        why = "nested too deeply" if isinstance(err, RecursionError) else err
        raise OptionError(f"bad value for --csi-volume-attributes: {why}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise OptionError(
            "bad value for --csi-volume-attributes: expected a JSON object of strings"
        )
    return value
