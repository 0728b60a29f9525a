"""Help text and the Markdown options table, both generated from the schema.

``python -m mount_options.docs`` prints ``docs/options.md``; a test fails
when the committed file and this output drift apart (``make docs``
regenerates it).
"""

from __future__ import annotations

from mount_options.schema import ACCEPTED, SCHEMA, Option

_SECTION_TITLES = {
    "": "General",
    "debug": "Debugging",
    "metadata-cache": "Metadata cache",
    "file-cache": "SSD file cache",
    "ram-cache": "RAM tier (tierfs)",
    "file-system": "File system",
    "write": "Writes",
    "gcs-connection": "GCS connection",
    "gcs-retries": "GCS retries",
    "gcs-auth": "GCS authentication",
    "logging": "Logging",
    "metrics": "Metrics",
    "read": "Reads",
    "list": "Listing",
}


def _default(option: Option) -> str:
    if option.path == "file-cache:max-parallel-downloads":
        return "max(16, 2 x CPUs)"
    if option.default in ("", ()):
        return '""'
    return option.kind.render(option.default)


def _sections(include_hidden: bool) -> dict[str, list[Option]]:
    groups: dict[str, list[Option]] = {}
    for option in SCHEMA:
        if option.hidden and not include_hidden:
            continue
        groups.setdefault(option.section, []).append(option)
    return groups


def help_text(include_hidden: bool = False) -> str:
    """The options part of ``--help``: flag, colon path, kind, default, meaning."""
    lines = ["Options (flag | colon form for -o, CSI and the config file):"]
    for section, options in _sections(include_hidden).items():
        lines.append("")
        lines.append(f"  {_SECTION_TITLES.get(section, section)}:")
        for option in options:
            value = "" if option.kind.name == "bool" else f"={option.kind.name.upper()}"
            path = option.path if option.in_config else "command line only"
            flag = "-o OPTIONS" if option.flag == "o" else f"--{option.flag}{value}"
            lines.append(f"    {flag}  [{path}]  default {_default(option)}")
            notes = []
            if option.tierfs:
                notes.append("tierfs")
            if option.effect == ACCEPTED:
                notes.append("accepted for gcsfuse compatibility, no effect")
            if option.deprecated:
                notes.append(f"deprecated: {option.deprecated}")
            suffix = f" ({'; '.join(notes)})" if notes else ""
            lines.append(f"        {option.help}{suffix}")
    if not include_hidden:
        lines.append("")
        lines.append("  --help-all lists the hidden options too.")
    return "\n".join(lines)


def markdown() -> str:
    """docs/options.md: every option, hidden ones included."""
    out = [
        "# tierfs options",
        "",
        "Generated from `mount_options/schema.py` by `make docs`; do not edit by hand.",
        "",
        "Every option has three spellings: the flag (`--metadata-cache-ttl-secs=-1`, also in",
        "`-o` and fstab as `metadata_cache_ttl_secs=-1`), the colon form for `-o`, CSI",
        "`mountOptions` and the config-file key (`metadata-cache:ttl-secs:-1`), and the nested",
        "YAML key (`metadata-cache: {ttl-secs: -1}`). Notes: **tierfs** = tierfs's own option;",
        "**no effect** = accepted so that gcsfuse lines work, but tierfs does nothing with it;",
        "*hidden* = not in `--help` (as in gcsfuse).",
        "",
    ]
    for section, options in _sections(include_hidden=True).items():
        out.append(f"## {_SECTION_TITLES.get(section, section)}")
        out.append("")
        out.append("| flag | colon path | type | default | meaning |")
        out.append("|---|---|---|---|---|")
        for option in options:
            notes = []
            if option.tierfs:
                notes.append("**tierfs**")
            if option.effect == ACCEPTED:
                notes.append("**no effect**")
            if option.deprecated:
                notes.append(f"deprecated: {option.deprecated}")
            if option.hidden:
                notes.append("*hidden*")
            path = f"`{option.path}`" if option.in_config else "(command line only)"
            meaning = option.help.replace("|", "\\|") + (f" ({', '.join(notes)})" if notes else "")
            out.append(
                f"| `--{option.flag}` | {path} | {option.kind.name} "
                f"| `{_default(option)}` | {meaning} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
