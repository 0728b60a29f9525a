"""Bad options through the real console scripts: one line on stderr, the right exit status.

The console scripts ``tierfs`` and ``mount.tierfs`` of this virtualenv run as subprocesses for
the main cases, the help and the dry-run JSON, so entry points, argument handling and error
printing are exercised as a user meets them. Interpreter start-up dominates that cost, so the
module fixture starts all those runs at once (with a private bytecode cache). The whole error
table also runs in-process through the same entry functions (``tierfs.cli.main.main`` and
``mount_helper_main``), which is cheap, and the subprocess runs must match it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import pytest

from mount_options import SCHEMA, SOURCES
from tierfs.cli import main as tierfs_cli

BIN = Path(sys.executable).parent
TIERFS = str(BIN / "tierfs")
MOUNT_HELPER = str(BIN / "mount.tierfs")
HUGE_DURATION = "1" + "0" * 308 + "h"  # 1e308 hours: finite digits, infinite seconds

Invocation = tuple[str, ...]


class Runner:
    """Runs the console scripts; ``{tmp}`` in an argument is the fixture's file directory."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = str(tmp)
        self.env = env
        self._done: dict[Invocation, subprocess.CompletedProcess[str]] = {}

    def expand(self, argv: Iterable[str]) -> Invocation:
        return tuple(a.replace("{tmp}", self.tmp) for a in argv)

    def _run(self, argv: Invocation) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, env=self.env, check=False
        )

    def prefetch(self, invocations: Iterable[Iterable[str]]) -> None:
        todo = list(dict.fromkeys(self.expand(i) for i in invocations))
        with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as pool:
            self._done.update(zip(todo, pool.map(self._run, todo), strict=True))

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """The real console script, as a subprocess."""
        key = self.expand(argv)
        if key not in self._done:
            self._done[key] = self._run(key)
        return self._done[key]

    def local(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """The console script's entry function, in this process."""
        script, *args = self.expand(argv)
        entry = tierfs_cli.main if script == TIERFS else tierfs_cli.mount_helper_main
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.dict(os.environ),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            os.environ.pop("TIERFS_DEBUG", None)
            try:
                entry(args)
                code: int | str | None = 0
            except SystemExit as exit_:
                code = exit_.code
        return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())

    def dry_run(self, *args: str) -> dict:
        result = self(TIERFS, "mount", "--dry-run", *args)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        return json.loads(result.stdout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], line: str) -> None:
    assert "Traceback" not in result.stderr
    assert result.stderr == line + "\n"
    assert result.stdout == ""
    assert result.returncode == 2


CONFIG_FILES = {
    "bad-yaml.yaml": "implicit-dirs: true\n  ttl: 5\n",
    "unknown-key.yaml": "metadata-cache:\n  ttl-sec: 5\n",
    "section-scalar.yaml": "file-cache: 100\n",
    "bad-value.yaml": "file-system:\n  uid: root\n",
    "loop.yaml": "app-name: &a [*a]\n",
    "ro.yaml": "file-system:\n  fuse-options: [ro]\n",
    "gcsfuse_config.yaml": "write:\n  global-max-blocks: 8\n",
    "tierfs.yaml": "logging:\n  severity: debug\nmetadata-cache:\n  ttl-secs: 5\n"
    "file-system:\n  file-mode: 600\n",
}


# --- (script, arguments, the one line expected on stderr) ----------------------------------------
# "{tmp}" is replaced by the directory holding the config files above.

ERRORS = [
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "metadata-cache:ttl-sec:-1", "my-bucket", "/mnt"],
        "tierfs: unknown option 'metadata-cache:ttl-sec' (did you mean 'metadata-cache:ttl-secs'?)",
        id="unknown-colon-option",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "-o", "metadata-cache:ttl-sec:-1", "--dry-run"],
        "tierfs: unknown option 'metadata-cache:ttl-sec' (did you mean 'metadata-cache:ttl-secs'?)",
        id="helper-unknown-colon-option",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "-o", "rw,implicit_dir,user"],
        "tierfs: unknown option 'implicit_dir' (did you mean 'implicit-dirs'?)",
        id="helper-unknown-flag-form",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--implicit-dir", "my-bucket", "/mnt"],
        "tierfs: unknown option '--implicit-dir' (did you mean '--implicit-dirs'?)",
        id="unknown-flag",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--metadata-cache-ttl-sec=5", "my-bucket", "/mnt"],
        "tierfs: unknown option '--metadata-cache-ttl-sec' "
        "(did you mean '--metadata-cache-ttl-secs'?)",
        id="unknown-flag-with-value",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-file-cache-max-size=5", "my-bucket", "/mnt"],
        "tierfs: unknown option '--file-cache-max-size' (did you mean '--file-cache-max-size-mb'?)",
        id="unknown-single-dash-flag",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--uid=abc", "my-bucket", "/mnt"],
        "tierfs: bad value 'abc' for option 'file-system:uid': expected an integer",
        id="int",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--stat-cache-max-size-mb=1_0", "my-bucket", "/mnt"],
        "tierfs: bad value '1_0' for option 'metadata-cache:stat-cache-max-size-mb': "
        "expected an integer",
        id="int-with-underscore",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--uid=\u0661\u0660", "my-bucket", "/mnt"],
        "tierfs: bad value '\u0661\u0660' for option 'file-system:uid': expected an integer",
        id="int-in-other-digits",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--implicit-dirs=maybe", "my-bucket", "/mnt"],
        "tierfs: bad value 'maybe' for option 'implicit-dirs': expected true or false",
        id="bool",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "file_mode=999", "my-bucket", "/mnt"],
        "tierfs: bad value '999' for option 'file-system:file-mode': "
        "expected an octal mode such as 0644",
        id="octal",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--dir-mode=1777", "my-bucket", "/mnt"],
        "tierfs: bad value '1777' for option 'file-system:dir-mode': "
        "expected an octal mode such as 0644, at most 0777",
        id="octal-too-big",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--log-severity", "loud", "my-bucket", "/mnt"],
        "tierfs: bad value 'loud' for option 'logging:severity': "
        "expected one of trace | debug | info | warning | error | off",
        id="enum",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--client-protocol=quic", "my-bucket", "/mnt"],
        "tierfs: bad value 'quic' for option 'gcs-connection:client-protocol': "
        "expected one of http1 | http2 | grpc | httpmtls",
        id="enum-protocol",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--max-retry-sleep=soon", "my-bucket", "/mnt"],
        "tierfs: bad value 'soon' for option 'gcs-retries:max-retry-sleep': "
        "expected a duration such as 30s, 1m30s or 1500ms",
        id="duration",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--http-client-timeout=-5s", "my-bucket", "/mnt"],
        "tierfs: bad value '-5s' for option 'gcs-connection:http-client-timeout': "
        "expected a duration such as 30s, 1m30s or 1500ms",
        id="negative-duration",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--sequential-read-size-mb=2000", "my-bucket", "/mnt"],
        "tierfs: bad value '2000' for option 'gcs-connection:sequential-read-size-mb': "
        "expected a value from 1 to 1024",
        id="range-both-ends",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "metadata-cache:ttl-secs:-2", "my-bucket", "/mnt"],
        "tierfs: bad value '-2' for option 'metadata-cache:ttl-secs': "
        "expected a value of at least -1",
        id="range-minimum",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--uid=4294967296", "my-bucket", "/mnt"],
        "tierfs: bad value '4294967296' for option 'file-system:uid': "
        "expected a value from -1 to 4294967294",
        id="uid-past-uid_t",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "--dry-run", "-o", "gid=99999999999"],
        "tierfs: bad value '99999999999' for option 'file-system:gid': "
        "expected a value from -1 to 4294967294",
        id="gid-past-gid_t",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--retry-multiplier=abc", "my-bucket", "/mnt"],
        "tierfs: bad value 'abc' for option 'gcs-retries:multiplier': expected a number",
        id="float",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--retry-multiplier=1_5", "my-bucket", "/mnt"],
        "tierfs: bad value '1_5' for option 'gcs-retries:multiplier': expected a number",
        id="float-with-underscore",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--write-block-size-mb=0.3", "my-bucket", "/mnt"],
        "tierfs: bad value '0.3' for option 'write:block-size-mb': expected a multiple of 0.25",
        id="multiple-of",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--custom-endpoint=localhost:4443", "my-bucket", "/mnt"],
        "tierfs: bad value 'localhost:4443' for option 'gcs-connection:custom-endpoint': "
        "expected a URL such as http://127.0.0.1:4443",
        id="endpoint-url",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "ro,rw", "my-bucket", "/mnt"],
        "tierfs: options 'ro' and 'rw' contradict each other: give one",
        id="ro-rw",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "-o", "rw,ro", "--dry-run"],
        "tierfs: options 'ro' and 'rw' contradict each other: give one",
        id="helper-ro-rw",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--anonymous-access", "--key-file=/k.json", "my-bucket", "/mnt"],
        "tierfs: options 'gcs-auth:anonymous-access' and 'gcs-auth:key-file' exclude each other",
        id="exclusive",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "uid", "my-bucket", "/mnt"],
        "tierfs: option 'uid' needs a value (uid=...)",
        id="missing-value-in-o",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "my-bucket", "/mnt", "--log-severity"],
        "tierfs: flag '--log-severity' needs a value",
        id="missing-flag-value",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "-o", "ro=1", "my-bucket", "/mnt"],
        "tierfs: kernel option 'ro' takes no value",
        id="kernel-option-value",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "--implicit-dirs"],
        "tierfs: unknown flag '--implicit-dirs' for mount.tierfs (options go in -o)",
        id="helper-flag",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file=/nonexistent/tierfs.yaml", "my-bucket", "/mnt"],
        "tierfs: cannot read config file '/nonexistent/tierfs.yaml': No such file or directory",
        id="missing-config-file",
    ),
    pytest.param(
        MOUNT_HELPER,
        ["my-bucket", "/mnt", "-o", "config_file=/nonexistent/tierfs.yaml", "--dry-run"],
        "tierfs: cannot read config file '/nonexistent/tierfs.yaml': No such file or directory",
        id="helper-missing-config-file",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}", "my-bucket", "/mnt"],
        "tierfs: cannot read config file '{tmp}': Is a directory",
        id="config-file-is-a-directory",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}/latin1.yaml", "my-bucket", "/mnt"],
        "tierfs: cannot read config file '{tmp}/latin1.yaml': not UTF-8 text",
        id="config-file-not-utf8",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}/bad-yaml.yaml", "my-bucket", "/mnt"],
        "tierfs: config file '{tmp}/bad-yaml.yaml' line 2: mapping values are not allowed here",
        id="invalid-yaml",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}/unknown-key.yaml", "my-bucket", "/mnt"],
        "tierfs: config file '{tmp}/unknown-key.yaml': unknown key 'metadata-cache:ttl-sec' "
        "(did you mean 'metadata-cache:ttl-secs'?)",
        id="config-unknown-key",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}/section-scalar.yaml", "my-bucket", "/mnt"],
        "tierfs: config file '{tmp}/section-scalar.yaml': "
        "'file-cache' is a section and holds options, not a value",
        id="config-section-scalar",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--config-file={tmp}/bad-value.yaml", "my-bucket", "/mnt"],
        "tierfs: config file '{tmp}/bad-value.yaml': bad value 'root' for option "
        "'file-system:uid': expected an integer",
        id="config-bad-value",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--csi-volume-attributes", '{"fileCacheCapacit": "10Gi"}',
         "my-bucket", "/mnt"],
        "tierfs: unknown volume attribute 'fileCacheCapacit' (did you mean 'fileCacheCapacity'?)",
        id="csi-unknown-attribute",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--csi-volume-attributes", '{"fileCacheCapacity": "10GB"}',
         "my-bucket", "/mnt"],
        "tierfs: bad value '10GB' for volume attribute 'fileCacheCapacity': "
        "expected a Kubernetes quantity such as 10Gi or 500Mi",
        id="csi-bad-quantity",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--csi-volume-attributes", '{"mountOptions": "implicit-dirs,o=ro"}',
         "my-bucket", "/mnt"],
        "tierfs: bad value 'ro' for option 'o': "
        "expected one of async, atime, dirsync, exec, noatime, noexec, sync",
        id="csi-o-ro",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "--csi-volume-attributes", "[1]", "my-bucket", "/mnt"],
        "tierfs: bad value for --csi-volume-attributes: expected a JSON object of strings",
        id="csi-not-an-object",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "My_Bucket", "/mnt"],
        "tierfs: bad bucket name 'My_Bucket': expected 3-222 characters of lowercase letters, "
        "digits, '-', '_' and '.', starting and ending with a letter or digit",
        id="bad-bucket",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "gs://goog-data/x", "/mnt"],
        "tierfs: bad bucket name 'goog-data': "
        "expected no 'goog' prefix, no 'google' inside and no '..'",
        id="bad-bucket-goog",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "my-bucket"],
        "tierfs: give a bucket and a mountpoint: tierfs mount BUCKET MOUNTPOINT",
        id="missing-mountpoint",
    ),
    pytest.param(
        TIERFS,
        ["mount", "--dry-run", "my-bucket/a", "--only-dir=b", "/mnt"],
        "tierfs: give the prefix once: BUCKET/PREFIX or --only-dir, not both",
        id="prefix-twice",
    ),
    pytest.param(
        TIERFS,
        ["frobnicate"],
        "tierfs: unknown command 'frobnicate' (try 'tierfs --help')",
        id="unknown-command",
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> Runner:
    tmp = tmp_path_factory.mktemp("configs")
    for name, text in CONFIG_FILES.items():
        (tmp / name).write_text(text)
    (tmp / "latin1.yaml").write_bytes(b"app-name: caf\xe9\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIERFS_DEBUG", "PYTHONDONTWRITEBYTECODE")}  # fmt: skip
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    runner = Runner(tmp, env)
    runner(TIERFS, "--version")  # fills the bytecode cache before the crowd starts
    runner.prefetch(
        [
            *((p.values[0], *p.values[1]) for p in ERRORS if p.id in THROUGH_SCRIPTS),
            *(p.values[0] for p in (*HELP_COMMANDS, *HELP_ALL_COMMANDS)),
            *PREFETCH,
        ]
    )
    return runner


@pytest.mark.parametrize(("script", "args", "line"), ERRORS)
def test_bad_input_gives_one_line_and_exit_2(cli, script, args, line):
    assert_one_line_error(cli.local(script, *args), line.replace("{tmp}", cli.tmp))


# The cases that also run through the real console scripts.
THROUGH_SCRIPTS = {
    "unknown-colon-option", "helper-unknown-colon-option", "unknown-flag",
    "unknown-flag-with-value", "int", "bool", "octal", "enum", "duration", "range-both-ends",
    "range-minimum", "ro-rw", "helper-ro-rw", "missing-config-file", "invalid-yaml",
    "csi-unknown-attribute", "bad-bucket", "missing-mountpoint",
}  # fmt: skip


@pytest.mark.parametrize(("script", "args", "line"), [p for p in ERRORS if p.id in THROUGH_SCRIPTS])
def test_console_scripts_give_one_line_and_exit_2(cli, script, args, line):
    result = cli(script, *args)
    assert_one_line_error(result, line.replace("{tmp}", cli.tmp))
    local = cli.local(script, *args)
    assert (result.returncode, result.stdout, result.stderr) == (
        local.returncode,
        local.stdout,
        local.stderr,
    )


def test_every_through_scripts_id_exists():
    assert THROUGH_SCRIPTS <= {p.id for p in ERRORS}


# --- bugs found while writing this suite (see each reason) ------------------------------------

BUG_HUGE_QUANTITY = (TIERFS, "mount", "--dry-run", "--csi-volume-attributes",
                     '{"fileCacheCapacity": "1e999"}', "my-bucket", "/mnt")  # fmt: skip
BUG_HUGE_DURATION = (TIERFS, "mount", "--dry-run", f"--stat-cache-ttl={HUGE_DURATION}",
                     f"--type-cache-ttl={HUGE_DURATION}", "my-bucket", "/mnt")  # fmt: skip
BUG_LOOP = (TIERFS, "mount", "--dry-run", "--config-file={tmp}/loop.yaml", "my-bucket", "/mnt")
URL_TYPO = "gcs-connection:custom-endpont:http://127.0.0.1:4443"
BUG_URL_NAME = (TIERFS, "mount", "--dry-run", "-o", URL_TYPO, "my-bucket", "/mnt")
BUG_HINT_TOKENS = ["config-file:/etc/tierfs.yaml", "debug_fs:true"]
BUG_RW_RO = (MOUNT_HELPER, "my-bucket", "/mnt", "-o", "rw,config_file={tmp}/ro.yaml", "--dry-run")


def test_huge_quantity_is_a_bad_value(cli):
    result = cli.local(*BUG_HUGE_QUANTITY)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "tierfs: bad value '1e999' for volume attribute 'fileCacheCapacity': expected "
    )


def test_infinite_duration_is_a_bad_value(cli):
    result = cli.local(*BUG_HUGE_DURATION)
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"tierfs: bad value '{HUGE_DURATION}' for option "
        "'metadata-cache:deprecated-stat-cache-ttl': expected "
    )


def test_recursive_yaml_is_a_bad_value(cli):
    result = cli.local(*BUG_LOOP)
    assert result.returncode == 2
    assert result.stderr.startswith("tierfs: config file '")
    assert "': bad value " in result.stderr and "'app-name'" in result.stderr


def test_unknown_colon_option_with_url_value_is_named_without_the_value(cli):
    assert_one_line_error(
        cli.local(*BUG_URL_NAME),
        "tierfs: unknown option 'gcs-connection:custom-endpont' "
        "(did you mean 'gcs-connection:custom-endpoint'?)",
    )


@pytest.mark.parametrize("token", BUG_HINT_TOKENS)
def test_hint_never_suggests_the_name_given(cli, token):
    result = cli.local(TIERFS, "mount", "--dry-run", "-o", token, "my-bucket", "/mnt")
    assert result.returncode == 2
    name = token.split(":")[0]
    assert result.stderr == f"tierfs: option '{name}' has no colon form: write {name}=VALUE\n"
    assert f"did you mean '{name}'" not in result.stderr


def test_helper_rw_yields_to_config_file_ro(cli):
    result = cli.local(*BUG_RW_RO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["fuse_options"] == ["ro"]


def test_closed_stdout_stops_quietly(cli):
    proc = subprocess.Popen(
        [TIERFS, "mount", "--help-all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli.env,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away before tierfs writes anything
    _, stderr = proc.communicate(timeout=60)
    assert stderr == ""  # `tierfs mount --help-all | head` stops quietly


# --- help ------------------------------------------------------------------------------------


def help_output(cli: Runner, *argv: str) -> str:
    result = cli(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def mentions_flag(text: str, flag: str) -> bool:
    if flag == "o":
        return re.search(r"(?m)^\s+-o OPTIONS\s", text) is not None
    return re.search(rf"(?<![\w-])--{re.escape(flag)}(?![\w-])", text) is not None


HELP_COMMANDS = [
    pytest.param((TIERFS, "--help"), id="tierfs --help"),
    pytest.param((TIERFS, "mount", "--help"), id="tierfs mount --help"),
    pytest.param((MOUNT_HELPER, "--help"), id="mount.tierfs --help"),
]
HELP_ALL_COMMANDS = [
    pytest.param((TIERFS, "--help-all"), id="tierfs --help-all"),
    pytest.param((TIERFS, "mount", "--help-all"), id="tierfs mount --help-all"),
    pytest.param((MOUNT_HELPER, "--help-all"), id="mount.tierfs --help-all"),
]


@pytest.mark.parametrize("argv", HELP_COMMANDS)
def test_help_lists_every_visible_option_and_no_hidden_one(cli, argv):
    text = help_output(cli, *argv)
    missing = [o.flag for o in SCHEMA if not o.hidden and not mentions_flag(text, o.flag)]
    shown_hidden = [o.flag for o in SCHEMA if o.hidden and mentions_flag(text, o.flag)]
    assert missing == []
    assert shown_hidden == []
    assert "--help-all lists the hidden options too." in text


@pytest.mark.parametrize("argv", HELP_ALL_COMMANDS)
def test_help_all_lists_every_option(cli, argv):
    text = help_output(cli, *argv)
    assert [o.flag for o in SCHEMA if not mentions_flag(text, o.flag)] == []
    assert [o.path for o in SCHEMA if o.in_config and f"[{o.path}]" not in text] == []


def test_help_shows_kind_and_colon_path(cli):
    text = help_output(cli, TIERFS, "mount", "--help")
    assert "--metadata-cache-ttl-secs=INT  [metadata-cache:ttl-secs]  default 60" in text
    assert "--implicit-dirs  [implicit-dirs]  default false" in text
    assert "--file-mode=OCTAL  [file-system:file-mode]  default 0644" in text
    assert "--config-file=PATH  [command line only]" in text


def test_no_arguments_prints_usage_and_exits_2(cli):
    """A usage error: the short usage on stderr (not the 225 lines of --help on stdout)."""
    result = cli.local(TIERFS)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: tierfs COMMAND [options]")


# --- the dry-run JSON --------------------------------------------------------------------------

DRY_DEFAULTS = ("my-bucket", "/mnt/data")
DRY_SOURCES = (
    "--config-file={tmp}/tierfs.yaml",
    "--implicit-dirs",
    "-o", "ro,uid=5,metadata-cache:ttl-secs:-1",
    "--max-retry-sleep", "1m30s",
    "--csi-volume-attributes", '{"fileCacheCapacity": "10Gi", "fileCacheForRangeRead": "true"}',
    "gs://my-bucket/models/",
    "relative/dir",
)  # fmt: skip
DRY_HELPER = (
    MOUNT_HELPER, "my-bucket", "/mnt", "-o", "implicit_dirs", "-o",
    "config_file={tmp}/gcsfuse_config.yaml", "-o", "only_dir=testDir,rename_dir_limit=3",
    "-o", "ro,file_mode=544", "--dry-run",
)  # fmt: skip
DRY_WARNING = (TIERFS, "mount", "--dry-run", "--stat-cache-ttl=30s", "my-bucket", "/mnt")


def test_dry_run_json_has_every_option_at_its_default(cli):
    data = cli.dry_run(*DRY_DEFAULTS)
    assert list(data) == ["bucket", "mountpoint", "options", "fuse_options"]
    assert (data["bucket"], data["mountpoint"], data["fuse_options"]) == (
        "my-bucket",
        "/mnt/data",
        [],
    )
    options = data["options"]
    assert list(options) == [o.path for o in SCHEMA]
    derived = {
        "metadata-cache:stat-cache-max-size-mb": 34,
        "file-cache:max-parallel-downloads": max(16, 2 * (os.cpu_count() or 1)),
    }
    for option in SCHEMA:
        entry = options[option.path]
        assert set(entry) == {"value", "source"}
        assert entry["source"] == "default", option.path
        expected = derived.get(option.path, option.kind.to_json(option.default))
        assert entry["value"] == expected, option.path


def test_dry_run_json_sources(cli):
    data = cli.dry_run(*DRY_SOURCES)
    options = data["options"]
    assert {path: entry["source"] for path, entry in options.items()} == {
        **{o.path: "default" for o in SCHEMA},
        "config-file": "flag",
        "logging:severity": "config-file",
        "file-system:file-mode": "config-file",
        "implicit-dirs": "flag",
        "file-system:fuse-options": "mount-option",
        "file-system:uid": "mount-option",
        "metadata-cache:ttl-secs": "mount-option",
        "gcs-retries:max-retry-sleep": "flag",
        "file-cache:max-size-mb": "csi-attribute",
        "file-cache:cache-file-for-range-read": "csi-attribute",
        "only-dir": "flag",
    }
    assert all(entry["source"] in SOURCES for entry in options.values())
    assert options["config-file"]["value"] == f"{cli.tmp}/tierfs.yaml"
    assert options["file-system:file-mode"]["value"] == "0600"
    assert options["gcs-retries:max-retry-sleep"]["value"] == "90s"
    assert options["metadata-cache:ttl-secs"]["value"] == -1
    assert options["logging:severity"]["value"] == "debug"
    assert options["file-cache:max-size-mb"]["value"] == 10240
    assert options["only-dir"]["value"] == "models"
    assert data["bucket"] == "my-bucket"
    assert data["mountpoint"] == os.path.abspath("relative/dir")
    assert data["fuse_options"] == ["ro"]


def test_mount_helper_dry_run_with_integration_test_forms(cli):
    result = cli(*DRY_HELPER)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    paths = ("implicit-dirs", "write:global-max-blocks", "only-dir",
             "file-system:rename-dir-limit", "file-system:file-mode")  # fmt: skip
    assert {p: data["options"][p] for p in paths} == {
        "implicit-dirs": {"value": True, "source": "mount-option"},
        "write:global-max-blocks": {"value": 8, "source": "config-file"},
        "only-dir": {"value": "testDir", "source": "mount-option"},
        "file-system:rename-dir-limit": {"value": 3, "source": "mount-option"},
        "file-system:file-mode": {"value": "0544", "source": "mount-option"},
    }
    assert data["fuse_options"] == ["ro"]


def test_warnings_go_to_stderr_and_do_not_fail(cli):
    result = cli.local(*DRY_WARNING)
    assert result.returncode == 0
    assert result.stderr == (
        "tierfs: warning: option 'metadata-cache:deprecated-stat-cache-ttl' is deprecated: "
        "use metadata-cache:ttl-secs\n"
    )
    assert json.loads(result.stdout)["options"]["metadata-cache:ttl-secs"] == {
        "value": 30,
        "source": "flag",
    }


# The other subprocess runs above, started together by the `cli` fixture.
PREFETCH = [
    (TIERFS, "mount", "--dry-run", *DRY_DEFAULTS),
    (TIERFS, "mount", "--dry-run", *DRY_SOURCES),
    DRY_HELPER,
]


def test_an_internal_error_is_one_line_for_the_user_and_a_traceback_in_the_daemon_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The last line of defence: the user reads one line; a daemon (its log set up) also
    logs the traceback at ERROR, so a background mount that dies says why in its log."""
    from tierfs.cli import main as cli

    def broken(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    assert cli._guarded(broken, []) == 1  # no log set up (a client command): nothing logged
    assert records == []
    daemon_log = logging.getLogger("tierfs")
    handler = Keep()
    daemon_log.addHandler(handler)
    try:
        assert cli._guarded(broken, []) == 1
    finally:
        daemon_log.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("tierfs: internal error: RuntimeError: a bug") == 2
    assert "Traceback" not in err
    assert [r.levelno for r in records] == [logging.ERROR]
    assert records[0].exc_info is not None and "a bug" in records[0].getMessage()
