"""docs/options.md is generated from the schema and must not drift from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mount_options import MOUNT_OPTION, SCHEMA, load, parse_option_string
from mount_options.docs import help_text, markdown

DOCS = Path(__file__).resolve().parent.parent / "docs" / "options.md"
ROW = re.compile(
    r"^\| `--(?P<flag>[^`]+)` \| (?P<path>[^|]+) \| (?P<kind>\w+) \| `(?P<default>[^`]*)` \|"
)


@pytest.fixture(scope="module")
def committed() -> str:
    return DOCS.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rows(committed) -> dict[str, dict[str, str]]:
    found = {}
    for line in committed.splitlines():
        match = ROW.match(line)
        if match:
            found[match["flag"]] = match.groupdict()
    return found


def test_docs_are_generated_from_the_schema(committed):
    assert committed == markdown(), (
        "docs/options.md is out of date with mount_options/schema.py: run `make docs`"
    )


def test_every_flag_is_in_the_docs(committed):
    missing = [o.flag for o in SCHEMA if f"| `--{o.flag}` |" not in committed]
    assert missing == [], "run `make docs`"


def test_docs_have_one_row_per_option_grouped_by_section(committed, rows):
    sections: dict[str, list[str]] = {}
    for option in SCHEMA:
        sections.setdefault(option.section, []).append(option.flag)
    assert list(rows) == [flag for flags in sections.values() for flag in flags]
    row_count = sum(1 for line in committed.splitlines() if line.startswith("| `--"))
    assert row_count == len(SCHEMA)


@pytest.mark.parametrize("option", SCHEMA, ids=lambda o: o.path)
def test_docs_row_matches_the_option(rows, option):
    row = rows[option.flag]
    path = f"`{option.path}`" if option.in_config else "(command line only)"
    assert (row["path"].strip(), row["kind"]) == (path, option.kind.name)


@pytest.mark.parametrize("option", SCHEMA, ids=[o.path for o in SCHEMA])
def test_documented_default_is_the_effective_default(rows, option):
    """What the docs and --help call the default is what a mount with no options gets."""
    config = load(parse_option_string("", MOUNT_OPTION), cpu_count=4)
    shown = rows[option.flag]["default"]
    if option.path == "file-cache:max-parallel-downloads":
        assert shown == "max(16, 2 x CPUs)"
        assert config[option.path] == 16
        return
    effective = config[option.path]
    expected = '""' if effective in ("", ()) else option.kind.render(effective)
    assert shown == expected


def test_help_text_default_matches_docs(rows):
    text = help_text(include_hidden=True)
    for option in SCHEMA:
        flag = "-o OPTIONS" if option.flag == "o" else f"--{option.flag}"
        head = re.compile(rf"{re.escape(flag)}(=[A-Z]+)?  ")
        line = next(x for x in text.splitlines() if head.match(x.strip()))
        assert line.rstrip().endswith(f"default {rows[option.flag]['default']}"), option.flag
