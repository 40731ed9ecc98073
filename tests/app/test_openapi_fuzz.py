"""Property-based fuzzing of the published OpenAPI description against the real server and PostgreSQL.

Schemathesis reads `/openapi.json` from a live server on loopback and generates requests for every operation in
it: data that fits the schema (positive) and data that does not (negative), sent with a token of the scope the
route asks for, an admin token, a token of another scope, an unknown token, or none. Every answer must be below
500, have a status code the operation documents, and the documented content type, headers and body; a negative
request must be refused with 4xx.

Generated ingest batches get a fresh `batch_id`. The rules that span fields (samples name the batch's devices
once per interval, intervals start within the last hour, util_source is "none" exactly when util is null) are
met by rewriting valid values into other valid values, so that most positive batches are stored: at least
`MIN_STORED_SHARE` of those sent with a token that may ingest.

Bounded in time: the ingest body is generated from a copy of its schema with short lists and scalar unknown
fields (`_bounded`); a negative batch that the published schema admits is skipped. Generation is derandomized
(the same code sends the same requests) and failures are not shrunk: the failing request is shown as generated,
with a curl command.

A longer search, by hand: GPUFLEET_FUZZ_SCALE=20 multiplies the number of requests, GPUFLEET_FUZZ_SEED=N draws
them from seed N instead.
"""

from __future__ import annotations

import copy
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema_rs
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.orm import Session, sessionmaker

from app.auth import BEARER
from app.settings import Settings
from app.sources import UTIL_SOURCES
from tests.agent.live_server import LiveServer
from tests.conftest import make_token

INGEST = "/api/v1/ingest"
BATCH_REF = "#/components/schemas/IngestBatchIn"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    scope: str | None
    """The token scope the route asks for; None: anyone may call it."""
    examples: int
    """Requests generated per generation mode."""
    takes_input: bool = False
    """Has parameters or a body, so that requests the schema does not admit can be made for it."""

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


ROUTES = (
    Route("GET", "/healthz", None, 5),
    Route("GET", "/readyz", None, 5),
    Route("POST", INGEST, "ingest", 100, takes_input=True),
    Route("GET", "/api/v1/report", "read", 60, takes_input=True),
    Route("GET", "/api/v1/billing", "read", 20, takes_input=True),
    Route("GET", "/metrics", "read", 20),
    # The dashboard's pages: HTML by default, their view model as JSON when asked (app/web/respond.py).
    *(
        Route("GET", path, "read", 3, takes_input=True)
        for path in ("/", "/gpus/idle", "/mig", "/waste", "/heatmap", "/heatmap/week", "/instances", "/billing")
    ),
    Route("GET", "/instances/{instance_id}", "read", 3, takes_input=True),
    # Alert rules: the API and the page, for admins.
    Route("GET", "/api/v1/alerts", "admin", 5),
    Route("POST", "/api/v1/alerts", "admin", 60, takes_input=True),
    # The rule's name may be any string: there is no request the schema refuses to make of these two.
    Route("GET", "/api/v1/alerts/{name}", "admin", 5),
    Route("PUT", "/api/v1/alerts/{name}", "admin", 20, takes_input=True),
    Route("DELETE", "/api/v1/alerts/{name}", "admin", 5),
    Route("POST", "/api/v1/alerts/{name}/enabled", "admin", 10, takes_input=True),
    Route("GET", "/alerts", "admin", 3, takes_input=True),
)
CASES = [
    pytest.param(route, mode, id=f"{route}-{mode}")
    for route in ROUTES
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or route.takes_input
]
MIN_STORED_SHARE = 0.5
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# The scope the route asks for more often than the others, so that most requests get past authentication.
CALLERS = ("right", "right", "right", "right", "admin", "none", "unknown", "other", "malformed")
LIST_BOUND = 4
SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))
SEED = os.environ.get("GPUFLEET_FUZZ_SEED")


# Known wrong answers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A wrong answer that is known, and whose area it is. While one is seen the test is an xfail naming it; any
    other wrong answer fails the test. Remove an entry once its area answers right."""

    area: str
    what: str
    matches: Callable[[Route, Any, Any, list[Failure]], bool]


# Empty while no wrong answer is known. An entry: Known("area (its files)", "what is wrong", matcher).
KNOWN: tuple[Known, ...] = ()


def _known(route: Route, case: Any, response: Any, failures: list[Failure]) -> Known | None:
    return next((k for k in KNOWN if k.matches(route, case, response, failures)), None)


# The published schema, and the copy the ingest body is generated from ---------------------------------------------


def _reachable(spec: dict[str, Any], ref: str) -> set[str]:
    """Names of the component schemas that `ref` uses, itself included."""
    schemas = spec["components"]["schemas"]
    found: set[str] = set()
    todo = [ref.rsplit("/", 1)[1]]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        stack: list[Any] = [schemas[name]]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if isinstance(node.get("$ref"), str):
                    todo.append(node["$ref"].rsplit("/", 1)[1])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return found


def _bound(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _bound(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "array":
        node["maxItems"] = min(node.get("maxItems", LIST_BOUND), LIST_BOUND)
    if node.get("type") == "object":
        if "maxProperties" in node:
            node["maxProperties"] = min(node["maxProperties"], LIST_BOUND)
        if "properties" in node and "additionalProperties" not in node:
            # Unknown fields stay, as short scalars: arbitrary JSON values take most of the generation time.
            node["additionalProperties"] = {"type": ["string", "integer", "boolean", "null"], "maxLength": 8}
    for value in node.values():
        _bound(value)


def _bounded(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of `spec` whose ingest body has lists of at most LIST_BOUND items; the answers are as published."""
    out = copy.deepcopy(spec)
    schemas = out["components"]["schemas"]
    for name in _reachable(out, BATCH_REF):
        _bound(schemas[name])
    return out


@dataclass(frozen=True)
class Published:
    spec: dict[str, Any]
    schema: Any
    """Schemathesis' schema, loaded from the bounded copy."""
    batch: jsonschema_rs.Validator
    """The published IngestBatchIn, formats included."""


@pytest.fixture
def server(settings: Settings, engine: object) -> Iterator[LiveServer]:
    # `engine` empties the tables after each test; each test gets a fresh server, which remembers none of them.
    with LiveServer(settings) as live:
        yield live


@pytest.fixture
def published(server: LiveServer) -> Published:
    answer = requests.get(server.url + "/openapi.json", timeout=10)
    answer.raise_for_status()
    spec = answer.json()
    validator = jsonschema_rs.validator_for(
        {"$ref": BATCH_REF, "components": spec["components"]}, validate_formats=True
    )
    # The Authorization header is not generated: each request's caller is drawn from CALLERS.
    config = schemathesis.Config.from_dict({"generation": {"with-security-parameters": False}})
    return Published(spec, schemathesis.openapi.from_dict(_bounded(spec), config=config), validator)


@dataclass(frozen=True)
class Tokens:
    secrets: dict[str, str]

    def header(self, caller: str, route: Route) -> str | None:
        scope = route.scope or "read"
        if caller == "none":
            return None
        if caller == "unknown":
            return "Bearer gpf_" + "x" * 43
        if caller == "malformed":
            return "Token " + self.secrets[scope]
        if caller == "other":
            return "Bearer " + self.secrets["read" if scope == "ingest" else "ingest"]
        return "Bearer " + self.secrets["admin" if caller == "admin" else scope]


@pytest.fixture
def tokens(sessions: sessionmaker[Session]) -> Tokens:
    return Tokens({scope: make_token(sessions, scope) for scope in ("ingest", "read", "admin")})


def test_every_published_operation_is_fuzzed(published: Published) -> None:
    operations = {
        f"{method.upper()} {path}": [scope for need in op["security"] for scope in need.get(BEARER, [])] or [None]
        for path, item in published.spec["paths"].items()
        for method, op in item.items()
    }
    # Every operation, each with the token scope it publishes.
    assert operations == {str(r): [r.scope] for r in ROUTES}


# Batches that get past the rules spanning fields ------------------------------------------------------------------


def _recent(rnd: random.Random, now: datetime) -> str:
    return (now - timedelta(seconds=rnd.uniform(60, 3600))).replace(microsecond=0).isoformat()


def _devices(gpus: Any) -> list[str]:
    """Give the GPUs and slices distinct uuids and slots, slices only on MIG GPUs; the devices' uuids."""
    known: list[str] = []
    if not isinstance(gpus, list):
        return known
    for g, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            continue
        if isinstance(gpu.get("uuid"), str):
            if gpu["uuid"].strip() in known:
                gpu["uuid"] = f"GPU-fuzz-{g}"
            known.append(gpu["uuid"].strip())
        slices = gpu.get("slices")
        if not isinstance(slices, list):
            continue
        if slices and gpu.get("mig_mode", False) is False:
            gpu["mig_mode"] = True
        slots: set[tuple[int, int]] = set()
        for s, sl in enumerate(slices):
            if not isinstance(sl, dict):
                continue
            if isinstance(sl.get("uuid"), str):
                if sl["uuid"].strip() in known:
                    sl["uuid"] = f"MIG-fuzz-{g}-{s}"
                known.append(sl["uuid"].strip())
            if type(sl.get("gpu_instance_id")) is int and type(sl.get("compute_instance_id")) is int:
                while (sl["gpu_instance_id"], sl["compute_instance_id"]) in slots:
                    sl["compute_instance_id"] = (sl["compute_instance_id"] + 1) % 0x10000
                slots.add((sl["gpu_instance_id"], sl["compute_instance_id"]))
    return known


def _fix_sample(sample: dict[str, Any], free: list[str], rnd: random.Random) -> bool:
    """Make `sample` name a device not yet sampled in its interval; False when none is left."""
    if sample.get("util_source", "none") in UTIL_SOURCES:
        if sample.get("util") is None:
            sample["util_source"] = "none"
        elif sample.get("util_source", "none") == "none":
            sample["util_source"] = rnd.choice([s for s in UTIL_SOURCES if s != "none"])
    if isinstance(sample.get("uuid"), str):
        if sample["uuid"].strip() in free:
            free.remove(sample["uuid"].strip())
        elif free:
            sample["uuid"] = free.pop(0)
        else:
            return False
    return True


def _fix_refs(sample: dict[str, Any], ids: list[int]) -> None:
    """Make `sample`'s holder references name holders of the batch, each once."""
    refs = sample.get("holders")
    if not isinstance(refs, list):
        return
    named: set[int] = set()
    kept = []
    for ref in refs:
        if isinstance(ref, dict) and isinstance(ref.get("ref"), int) and not isinstance(ref["ref"], bool):
            if not ids:
                continue
            ref["ref"] = ids[ref["ref"] % len(ids)]
            if ref["ref"] in named:
                continue
            named.add(ref["ref"])
        kept.append(ref)
    sample["holders"] = kept


def _ints(value: Any) -> Any:
    """Whole numbers written as 1.0 made plain integers: JSON Schema counts 1.0 as an integer, the server not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def fix_batch(body: dict[str, Any], rnd: random.Random, now: datetime) -> None:
    """Rewrite valid values of a generated batch into other valid values so that it meets the rules spanning
    fields (app/ingest/parse.py check_batch, SampleIn): a fresh batch id, devices listed once, slices only on MIG
    GPUs, intervals and events in the last hour, each sample naming a device of the batch once per interval, holder
    ids numbered in order and each sample's references naming them, each once."""
    body.update(_ints(body))
    if isinstance(body.get("batch_id"), str):
        body["batch_id"] = str(uuid.UUID(int=rnd.getrandbits(128), version=4))
    known = _devices(body.get("gpus"))
    holders = body.get("holders")
    ids: list[int] = []
    for h, holder in enumerate(holders if isinstance(holders, list) else []):
        if isinstance(holder, dict) and isinstance(holder.get("id"), int) and not isinstance(holder["id"], bool):
            holder["id"] = h
            ids.append(h)
    events = body.get("events")
    for event in events if isinstance(events, list) else []:
        if isinstance(event, dict) and isinstance(event.get("ts"), str):
            event["ts"] = _recent(rnd, now)
    intervals = body.get("intervals")
    if not isinstance(intervals, list):
        return
    for interval in intervals:
        if not isinstance(interval, dict):
            continue
        if isinstance(interval.get("start"), str):
            interval["start"] = _recent(rnd, now)
        if isinstance(interval.get("samples"), list):
            free = list(known)
            interval["samples"] = [
                s for s in interval["samples"] if not isinstance(s, dict) or _fix_sample(s, free, rnd)
            ]
            for sample in interval["samples"]:
                if isinstance(sample, dict):
                    _fix_refs(sample, ids)


def _prepare_batch(case: Any, mode: GenerationMode, rnd: random.Random, published: Published) -> None:
    if not isinstance(case.body, dict):
        return
    valid = published.batch.is_valid(case.body)
    if mode == GenerationMode.NEGATIVE and valid and case.meta.is_negative_at(ParameterLocation.BODY):
        reject()  # Outside the bounded copy's limits but within the published ones: not a negative batch.
    fixed = copy.deepcopy(case.body)
    fix_batch(fixed, rnd, datetime.now(UTC))
    # A negative batch stays invalid: a rewrite that would drop the value at fault is not used.
    if published.batch.is_valid(fixed) == valid:
        case.body = fixed


# The fuzzing -----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)
    """(caller, status) -> requests."""
    known: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    """Positive batches sent with a token that may ingest."""
    stored: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    """Why such batches were refused: the fields at fault."""

    def count_batch(self, response: Any) -> None:
        self.batches += 1
        if response.status_code == 200:
            self.stored += 1
        elif response.status_code == 422:
            detail = response.json().get("detail") or [{"field": "?", "message": response.json().get("error")}]
            self.refused[f"{detail[0]['field']}: {detail[0]['message']}"[:160]] += 1


@pytest.mark.parametrize(("route", "mode"), CASES)
def test_fuzz(route: Route, mode: GenerationMode, published: Published, server: LiveServer, tokens: Tokens) -> None:
    operation = published.schema[route.path][route.method]
    tally = Tally()
    http = requests.Session()

    @settings(
        max_examples=max(1, round(route.examples * SCALE)),
        derandomize=SEED is None,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(case=operation.as_strategy(generation_mode=mode), caller=st.sampled_from(CALLERS), rnd=st.randoms())
    @seed(int(SEED or 0))
    def run(case: Any, caller: str, rnd: random.Random) -> None:
        if route.path == INGEST:
            _prepare_batch(case, mode, rnd, published)
        header = tokens.header(caller, route)
        if header is not None:
            case.headers["Authorization"] = header
        response = case.call(base_url=server.url, session=http)
        tally.answers[caller, response.status_code] += 1
        if route.path == INGEST and mode == GenerationMode.POSITIVE and caller in ("right", "admin"):
            tally.count_batch(response)
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            known = _known(route, case, response, list(group.exceptions))
            if known is None:
                raise
            tally.known[f"{known.area}: {known.what}"] += 1

    run()
    print(f"\n{route} {mode}: answers {dict(sorted(tally.answers.items()))}")
    if tally.batches:
        share = tally.stored / tally.batches
        print(f"stored {tally.stored} of {tally.batches} batches ({share:.0%}); refused: {dict(tally.refused)}")
        assert share >= MIN_STORED_SHARE, tally.refused
    if tally.known:
        pytest.xfail("; ".join(f"{what} ({n}x)" for what, n in tally.known.items()))
