"""The rule file (GPUFLEET_ALERTS_FILE): alert rules as TOML, read when `gpufleet serve` starts (docs/alerts.md,
"The rule file"). Each `[[rule]]` table is one rule, with the fields of the API:

    [[rule]]
    name = "forgotten-gpus"
    condition = "gpu_idle"
    for = "2h"
    route = { owner = true, fallback = { slack = "https://hooks.slack.com/services/T0/B0/XXXX" } }

The file owns the rules it names: at start they are created or replaced by name, and file rules no longer in it are
deleted. Rules made through the API or the /alerts page are left alone, and cannot share a name with a file rule.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.orm import Session

from ..errors import ApiError, FieldProblem
from .rules import FILE, Origin, Rule, list_rules, store_file_rules
from .schemas import RuleIn, field_problems, to_rule

TABLE = "rule"
UPDATED_BY = "rule file"
# Several servers starting at once sync one after the other (any constant key; this one spells "gpfalert").
_SYNC_LOCK = 0x67706661_6C657274
_HEADER = re.compile(r"^\s*\[\[\s*\"?rule\"?\s*\]\]")
_TOML_LINE = re.compile(r"at line (\d+)")


class RuleFileError(Exception):
    """A rule file that cannot be used. `str()` is one line: `path:line: problem` (`path: problem` when the file
    cannot be read at all)."""

    def __init__(self, path: Path, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}" if line is not None else f"{path}: {problem}")


class _Lines:
    """Finds where a rule, or a key of it, is written, by scanning the text: tomllib keeps no positions."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()
        self.headers = [i for i, line in enumerate(self.lines) if _HEADER.match(line)]

    def rule(self, index: int) -> int:
        """1-based line of the `index`-th `[[rule]]` header (the first line if the file hides it)."""
        return self.headers[index] + 1 if index < len(self.headers) else 1

    def _span(self, index: int) -> range:
        if index >= len(self.headers):
            return range(len(self.lines))
        start = self.headers[index]
        end = self.headers[index + 1] if index + 1 < len(self.headers) else len(self.lines)
        return range(start, end)

    def key(self, index: int | None, field: str) -> int:
        """1-based line of `field` ("route.email[1]") in rule `index` (None: at the top level), or as near as can be
        told: the line of its nearest parent found, else the rule's header."""
        span = range(len(self.lines)) if index is None else self._span(index)
        found = None if index is None else span.start
        start = span.start
        for part in re.sub(r"\[\d+\]", "", field).split("."):
            name = re.escape(part)
            at_key = re.compile(rf"(?:^|[\s{{,.])\"?{name}\"?\s*[=.]")
            if index is None:
                at_header = re.compile(rf"^\s*\[\[?\s*\"?{name}\"?\s*[\].]")
            else:
                at_header = re.compile(rf"^\s*\[\s*\"?{TABLE}\"?\s*\.(?:[\w\"-]+\s*\.\s*)*\"?{name}\"?\s*\]")
            hit = next(
                (i for i in range(start, span.stop) if at_key.search(self.lines[i]) or at_header.match(self.lines[i])),
                None,
            )
            if hit is None:
                break
            found = start = hit
        return found + 1 if found is not None else 1


def _describe(problem: FieldProblem, more: int) -> str:
    extra = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{problem.field}: {problem.message}{extra}"


def parse_rule_file(path: Path, source: str) -> list[Rule]:
    """The rules of a rule file's text; RuleFileError naming the line of the first problem."""
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "syntax error"
        match = _TOML_LINE.search(message)
        raise RuleFileError(path, int(match.group(1)) if match else None, f"not valid TOML: {message}") from None
    lines = _Lines(source)
    for key in data:
        if key != TABLE:
            raise RuleFileError(path, lines.key(None, key), f"unknown key {key!r}: each rule is a [[rule]] table")
    tables: Any = data.get(TABLE, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise RuleFileError(path, lines.key(None, TABLE), "rule: write each rule as a [[rule]] table")
    rules: list[Rule] = []
    first_line: dict[str, int] = {}
    for index, table in enumerate(tables):
        label = f"rule {table['name']!r}" if isinstance(table.get("name"), str) else f"rule {index + 1}"
        try:
            rule = to_rule(RuleIn.model_validate(table), source=FILE)
        except ValidationError as exc:
            problems = field_problems(exc.errors())
            line = lines.key(index, problems[0].field)
            raise RuleFileError(path, line, f"{label}: {_describe(problems[0], len(problems) - 1)}") from None
        except ApiError as exc:
            line = lines.key(index, exc.detail[0].field)
            raise RuleFileError(path, line, f"{label}: {_describe(exc.detail[0], len(exc.detail) - 1)}") from None
        if rule.name in first_line:
            raise RuleFileError(
                path,
                lines.key(index, "name"),
                f"{label}: the name is used twice (first at line {first_line[rule.name]}): names are unique",
            )
        first_line[rule.name] = lines.key(index, "name")
        rules.append(replace(rule, origin=Origin(path, lines.rule(index))))
    return rules


def load_rule_file(path: Path) -> list[Rule]:
    """The rules of the file at `path`, checked; RuleFileError (one line, with the line number) otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RuleFileError(path, None, f"cannot read it: {exc.strerror or exc}") from None
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RuleFileError(path, None, "not UTF-8 text") from None
    return parse_rule_file(path, source)


@dataclass(frozen=True)
class SyncResult:
    """What a sync changed, by rule name."""

    created: list[str]
    replaced: list[str]
    deleted: list[str]


def sync_rule_file(session: Session, rules: Sequence[Rule], *, now: datetime) -> SyncResult:
    """Make the file rules in the database those of `rules` (from `load_rule_file`; empty: none). A rule whose name
    belongs to a rule made through the API or the page is a RuleFileError naming its line. Does not commit."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SYNC_LOCK})
    others = {r.name: r for r in list_rules(session) if r.source != FILE}
    for rule in rules:
        other = others.get(rule.name)
        if other is not None:
            where = rule.origin
            made = "the API" if other.source == "api" else "the /alerts page"
            raise RuleFileError(
                where.path if where else Path("rule file"),
                where.line if where else None,
                f"rule {rule.name!r}: a rule of that name was made through {made}: rename one of them",
            )
    created, replaced, deleted = store_file_rules(session, rules, by=UPDATED_BY, now=now)
    return SyncResult(created, replaced, deleted)
