"""The command line: ``tierfs COMMAND ...`` and the mount(8) helper ``mount.tierfs``.

Everything a user can get wrong ends here as one line on stderr and an exit
status: 2 for bad options or usage, 1 for a failure while doing the work.
No traceback reaches the user; ``TIERFS_DEBUG=1`` prints it for developers.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import mount_options
from mount_options import CommandLine, Config, OptionError
from mount_options.docs import help_text
from mount_options.target import parse_target
from tierfs import __version__
from tierfs.cli import daemon
from tierfs.cli.mountpoint import MountError, canonical, mounted_here

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


class UsageError(Exception):
    """Wrong use of the command line itself (missing operands, unknown command)."""


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(_guarded(_main, list(sys.argv[1:] if argv is None else argv)))


def mount_helper_main(argv: Sequence[str] | None = None) -> None:
    """``mount.tierfs SPEC DIR -o OPTIONS``, the helper mount(8) runs for type tierfs."""
    sys.exit(_guarded(_mount_helper, list(sys.argv[1:] if argv is None else argv)))


def _guarded(run: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return run(argv)
    except (OptionError, UsageError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `tierfs --help | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the last line of defence: one line, never a traceback
        daemon_log = logging.getLogger("tierfs")
        if daemon_log.handlers:  # a daemon, its log set up: the whole story goes there
            daemon_log.error("internal error, exiting: %s", err, exc_info=err)
        if os.environ.get("TIERFS_DEBUG"):
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help", "--help-all"):
        print(USAGE)
        print(help_text(include_hidden=bool(argv) and argv[0] == "--help-all"))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version", "version"):
        print(f"{PROG} {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "mount":
        line = mount_options.parse_flags(rest, MOUNT_EXTRAS)
        return _mount(line, ["mount", *rest], [at + 1 for at in line.positional_at])
    if command in ("unmount", "umount"):
        return _unmount(rest)
    if command == "stats":
        return _stats(rest)
    if command == "sync":
        return _sync(rest)
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


def _stats(argv: list[str]) -> int:
    from tierfs.cli.control import render_statistics, request_statistics

    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    if len(args) != 1 or args[0].startswith("-"):
        raise UsageError("usage: tierfs stats [--json] MOUNTPOINT")
    try:
        data = request_statistics(args[0])
    except OSError as err:
        print(
            f"{PROG}: no tierfs mount answers at {args[0]}: {err.strerror or err}", file=sys.stderr
        )
        return 1
    print(json.dumps(data, indent=2) if as_json else render_statistics(data))
    return 0


def _sync(argv: list[str]) -> int:
    """Exit 0 once every file closed (or written) at or below PATH (a tierfs mountpoint or a
    path inside one) is in GCS; else 1 and the first error, one line."""
    from tierfs.cli.control import request
    from tierfs.cli.prefetch import hung_mount_holding, tierfs_mount_of

    if len(argv) != 1 or argv[0].startswith("-"):
        raise UsageError("usage: tierfs sync PATH")
    target = canonical(argv[0])
    holder = hung_mount_holding(target)  # (its answer would never come)
    if holder is not None:
        print(f"{PROG}: sync {argv[0]}: the daemon of {holder} does not answer", file=sys.stderr)
        return 1
    if mounted_here(target) is not None:  # a mountpoint: never looked up (it may hang)
        mountpoint, relative = target, "."
    else:
        # Resolved whole, as `tierfs_mount_of` resolves it: a symlink to a directory in
        # a mount (~/data -> /mnt/gcs/data) was sent as "../home/u/data", which matched
        # no file, and sync said yes without waiting for anything.
        target = os.path.realpath(target)
        mountpoint = tierfs_mount_of(Path(target)) or ""
        relative = os.path.relpath(target, mountpoint) if mountpoint else ""
        if not mountpoint or relative.startswith(".."):
            print(f"{PROG}: no tierfs mount answers at {argv[0]}: not in one", file=sys.stderr)
            return 1
    try:
        answer = request(mountpoint, "sync", None, {"path": "" if relative == "." else relative})
    except OSError as err:
        print(
            f"{PROG}: no tierfs mount answers at {argv[0]}: {err.strerror or err}", file=sys.stderr
        )
        return 1
    if "error" in answer:
        print(f"{PROG}: sync {argv[0]}: {answer['error']}", file=sys.stderr)
        return 1
    return 0


def _unmount(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        raise UsageError("usage: tierfs unmount MOUNTPOINT")
    try:
        daemon.stop(argv[0])
    except MountError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    return 0


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
    from tierfs.mount import serve

    failures: list[str] = []

    def ready(message: str | None) -> None:
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
    trio.run(serve, config, ready)
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
    target = parse_target(spec)
    if target.prefix:
        if any(a.path == "only-dir" for a in parsed.assignments):
            raise UsageError("give the prefix once: BUCKET/PREFIX or --only-dir, not both")
        parsed.assignments.append(target.only_dir_assignment())
    return mount_options.load(
        parsed,
        bucket=target.bucket,
        mountpoint=canonical(mountpoint),
        read_text=lambda path: Path(path).read_text(encoding="utf-8"),
        cpu_count=os.cpu_count() or 1,
        absolute=absolute_path,
    )


def absolute_path(path: str) -> str:
    """A path option as gcsfuse resolves it: ``~`` expanded, then against the working
    directory of the one who mounts (the daemon leaves it for ``/``)."""
    return os.path.abspath(os.path.expanduser(path))


def _json_object(text: str) -> dict[str, str]:
    try:
        value = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, json.JSONDecodeError) as err:
        raise OptionError(f"bad value for --csi-volume-attributes: {err}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise OptionError(
            "bad value for --csi-volume-attributes: expected a JSON object of strings"
        )
    return value
