"""The docs name the tests that back their claims: every name must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"`(?:tests/)?(test_\w+\.py)::(test_\w+)`")


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_semantics_doc_names_only_existing_tests() -> None:
    text = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    references = REFERENCE.findall(text)
    assert len(references) > 30, "docs/semantics.md should back its claims with tests"
    missing = [
        f"{module}::{name}"
        for module, name in references
        if not (ROOT / "tests" / module).exists()
        or name not in defined_tests(ROOT / "tests" / module)
    ]
    assert missing == [], f"docs/semantics.md names tests that do not exist: {missing}"
