"""The /alerts page's rule form: its fields to the API's rule shape (app/alerts/schemas.py `RuleIn`) and back, and
each problem's field to the form field that shows it.

Lists are typed as text, separated by commas or spaces (tags as `key=value`); each lifecycle is a checkbox of its
own, since a posted form keeps one value per name (app/web/forms.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from ..alerts.fields import format_duration
from ..alerts.rules import NEEDS_FOR, Rule, Target
from ..analyse.window import LIFECYCLES
from ..errors import FieldProblem

KINDS = ("slack", "webhook", "email")
ROUTE_KINDS = (*KINDS, "owner")
DEFAULTS = {
    "condition": "gpu_idle",
    "for": "2h",
    "quiet": "0",
    "route_kind": "slack",
    "enabled": "on",
    "stop_dry_run": "on",
    "stop_grace": "1h",
}
"""A new rule's form."""

# Most specific first: a problem shows at the first form field whose prefix names it.
_FIELD_OF = (
    ("route.fallback.secret", "fallback_secret"),
    ("route.fallback", "fallback_target"),
    ("route.secret", "route_secret"),
    ("route.slack", "route_target"),
    ("route.webhook", "route_target"),
    ("route.email", "route_target"),
    ("route", "route_kind"),
    ("scope.regions", "scope_regions"),
    ("scope.instance_types", "scope_instance_types"),
    ("scope.lifecycles", "scope_lifecycles"),
    ("scope.tags", "scope_tags"),
    ("scope.users", "scope_users"),
    ("stop.grace", "stop_grace"),
    ("stop", "stop"),
)
FIELDS = ("name", "condition", "for", "usd_per_day", "tag", "quiet", "remind", "enabled")


def form_field(problem_field: str) -> str:
    """The form field that shows a problem with `problem_field` ("route.email[1]" -> "route_target"); `form` for
    one no field shows."""
    for prefix, name in _FIELD_OF:
        if problem_field == prefix or problem_field.startswith((prefix + ".", prefix + "[")):
            return name
    head = re.split(r"[.\[]", problem_field, maxsplit=1)[0]
    return head if head in FIELDS else "form"


def errors_by_field(problems: Iterable[FieldProblem]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in problems:
        name = form_field(p.field)
        label = "" if p.field in (name, "rule") or (name == "route_kind" and p.field == "route") else f"{p.field}: "
        out.setdefault(name, []).append(label + p.message)
    return out


def _items(text: str) -> list[str]:
    return [part for part in re.split(r"[,\s]+", text) if part]


def _target(kind: str, target: str, secret: str) -> dict[str, Any]:
    if kind == "email":
        return {"email": _items(target)}
    out: dict[str, Any] = {kind: target.strip()}
    if kind == "webhook" and secret:
        out["secret"] = secret
    return out


def _on(values: dict[str, str], name: str) -> bool:
    return values.get(name) in ("on", "true", "1")


def rule_data(values: dict[str, str]) -> tuple[dict[str, Any], list[FieldProblem]]:
    """The rule a posted form describes, in the API's shape (to check with `RuleIn`), and the problems only the form
    can have: a number or a tag list it cannot read, a route kind it does not offer."""
    problems: list[FieldProblem] = []
    condition = values.get("condition", "")
    data: dict[str, Any] = {"name": values.get("name", "").strip(), "condition": condition}
    # The form shows every field for every condition: what the chosen one takes no value for is not sent.
    wanted = {"for": condition in NEEDS_FOR, "tag": condition == "tag_waste", "remind": True}
    for key, used in wanted.items():
        if used and values.get(key, "").strip():
            data[key] = values[key].strip()
    data["quiet"] = values.get("quiet", "").strip() or "0"
    usd = values.get("usd_per_day", "").strip().removeprefix("$").replace(",", "")
    if usd and condition == "tag_waste":
        try:
            data["usd_per_day"] = float(usd)
            if not math.isfinite(data["usd_per_day"]):
                raise ValueError
        except ValueError:
            problems.append(FieldProblem("usd_per_day", f"not a number of dollars: {usd[:20]!r}"))
            data.pop("usd_per_day", None)
    tags: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in values.get("scope_tags", "").split(","))):
        key, sep, value = pair.partition("=")
        if not sep:
            key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            problems.append(FieldProblem("scope.tags", f"expected key=value, not {pair[:40]!r}"))
            continue
        tags[key.strip()] = value.strip()
    data["scope"] = {
        "regions": _items(values.get("scope_regions", "")),
        "instance_types": _items(values.get("scope_instance_types", "")),
        "lifecycles": [lc for lc in LIFECYCLES if _on(values, f"lifecycle_{lc}")],
        "tags": tags,
        "users": _items(values.get("scope_users", "")),
    }
    kind = values.get("route_kind", "")
    if kind in KINDS:
        data["route"] = _target(kind, values.get("route_target", ""), values.get("route_secret", ""))
    elif kind == "owner":
        data["route"] = {"owner": True}
        fallback = values.get("fallback_kind", "")
        if fallback in KINDS:
            data["route"]["fallback"] = _target(
                fallback, values.get("fallback_target", ""), values.get("fallback_secret", "")
            )
    else:
        problems.append(FieldProblem("route", "choose where messages go: " + ", ".join(ROUTE_KINDS)))
        data["route"] = {}
    if _on(values, "stop"):
        data["stop"] = {
            "dry_run": _on(values, "stop_dry_run"),
            "grace": values.get("stop_grace", "").strip() or "1h",
            "spot": _on(values, "stop_spot"),
            "capacity_block": _on(values, "stop_capacity_block"),
        }
    data["enabled"] = _on(values, "enabled")
    return data, problems


def _target_values(prefix: str, target: Target) -> dict[str, str]:
    return {f"{prefix}_kind": target.channel, f"{prefix}_target": target.shown}


def rule_values(rule: Rule) -> dict[str, str]:
    """A stored rule as the edit form shows it; secrets stay out (left empty, the stored one is kept)."""
    values = {
        "name": rule.name,
        "condition": rule.condition,
        "for": format_duration(rule.for_s) if rule.for_s is not None else "",
        "usd_per_day": f"{rule.usd_per_day:g}" if rule.usd_per_day is not None else "",
        "tag": rule.tag_key or "",
        "scope_regions": ", ".join(rule.scope.regions),
        "scope_instance_types": ", ".join(rule.scope.instance_types),
        "scope_tags": ", ".join(f"{k}={v}" for k, v in rule.scope.tags),
        "scope_users": ", ".join(rule.scope.users),
        "quiet": format_duration(rule.quiet_s),
        "remind": format_duration(rule.remind_s) if rule.remind_s is not None else "",
        "route_kind": rule.route.kind,
        "stop_grace": "1h",
        "stop_dry_run": "on",
    }
    values.update({f"lifecycle_{lc}": "on" for lc in rule.scope.lifecycles})
    target = rule.route.target
    if target is not None:
        values.update(_target_values("fallback" if rule.route.owner else "route", target))
    if rule.stop is not None:
        values.update(
            stop="on",
            stop_grace=format_duration(rule.stop.grace_s),
            stop_dry_run="on" if rule.stop.dry_run else "",
            stop_spot="on" if rule.stop.spot else "",
            stop_capacity_block="on" if rule.stop.capacity_block else "",
        )
    if rule.enabled:
        values["enabled"] = "on"
    return values


def secrets_set(rule: Rule) -> dict[str, bool]:
    """Which secret fields of the edit form have a stored secret behind them."""
    target = rule.route.target
    if target is None or not target.secret:
        return {}
    return {"fallback_secret" if rule.route.owner else "route_secret": True}
