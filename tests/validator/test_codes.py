"""`mtpstack.validator.CODES` is the one list of finding codes: every code a rule writes is in it, and it lists no other."""

from __future__ import annotations

import ast
from pathlib import Path

from mtpstack.validator import CODES

VALIDATOR = Path(__file__).resolve().parents[2] / "validator"


def written_codes() -> set[str]:
    """Every `code="..."` a module of the validator passes (to `Finding`, or to a helper that makes one)."""
    found = set()
    for path in VALIDATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "code" and isinstance(node.value, ast.Constant):
                found.add(node.value.value)
    return found


def test_every_code_a_rule_writes_is_listed_and_none_other():
    assert written_codes() == CODES
