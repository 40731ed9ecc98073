"""`gpufleet-agent doctor`: one line per check, for the person baking an AMI or debugging a host.

Lines are `ok`, `WARN` (a figure the agent cannot read here, with what to grant, or batches the sender set
aside; not a failure) or `FAIL`.
With `--json` the same checks come with the host's capability report (`capabilities`).

The token check posts an empty document to the ingest URL: the server authenticates before it validates,
so a good token earns a 422 (nothing stored) and a bad one a 401 or 403.
"""

from __future__ import annotations

import json
import ssl
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import __version__
from .collect.model import GpuInfo, Interval
from .collect.privilege import FIGURES, GRANTS
from .config import AgentConfig, ConfigError
from .httpclient import HttpError, request, tls_context
from .send import ASIDE_RETRY_S, Poster
from .spool import Spool

SAMPLE_S = 1.0  # a short interval, long enough for GPM's 100 ms minimum and a few buffer samples


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    warn: bool = False

    @property
    def status(self) -> str:
        return "fail" if not self.ok else "warn" if self.warn else "ok"

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "message": self.message}


def run_checks(config: AgentConfig, report: dict[str, Any] | None = None) -> Iterator[Check]:
    """The checks in order; with `report`, the capability report of this host is put in it (key "report")."""
    yield from _nvml_checks(config, report)
    yield _identity_check(config)
    yield _spool_check(config)
    yield from _server_checks(config)


def _nvml_checks(config: AgentConfig, report: dict[str, Any] | None) -> Iterator[Check]:
    from . import capabilities
    from .collect import Collector
    from .nvml import Absent, Nvml, NvmlUnavailable, load_library
    from .run import holder_reader

    try:
        nvml = Nvml.open(load_library(config.fake_nvml))
    except NvmlUnavailable as exc:
        yield Check("NVML", False, str(exc))
        return
    try:
        driver, cuda = nvml.driver_version(), nvml.cuda_version()
        fake = f" (simulated: {config.fake_nvml})" if config.fake_nvml else ""
        yield Check(
            "NVML",
            True,
            f"driver {'unknown' if isinstance(driver, Absent) else driver}, "
            f"CUDA {'unknown' if isinstance(cuda, Absent) else cuda}{fake}",
        )
        collector = Collector(nvml, holders=holder_reader(config, nvml.lib))
        interval = collector.sample(SAMPLE_S)
        gpus = interval.gpus
        if not gpus:
            yield Check("GPUs", False, "NVML sees no GPU")
            return
        names = Counter(g.name for g in gpus)
        mig = [g for g in gpus if g.mig_mode]
        slices = sum(len(g.slices) for g in gpus)
        free = sum(g.unpartitioned_slices or 0 for g in mig)
        summary = ", ".join(f"{n} x {name}" for name, n in names.items())
        if mig:
            summary += f"; {len(mig)} in MIG mode with {slices} slices, {free} compute slices unpartitioned"
        yield Check("GPUs", True, summary)
        sources = Counter(r.util_source for r in interval.readings if r.util is not None)
        missing = [r for r in interval.readings if r.util is None]
        reasons = Counter(
            reason
            for g in gpus
            for reason in [g.util_unavailable_reason, *(s.util_unavailable_reason for s in g.slices)]
            if reason
        )
        parts = [f"{source} on {n}" for source, n in sorted(sources.items())]
        if missing:
            top = "; ".join(f"{n} x {why}" for why, n in reasons.most_common(2))
            parts.append(f"absent on {len(missing)} ({top})" if top else f"absent on {len(missing)}")
        # A MIG slice without a figure is expected (Ampere, before DCGM); a whole GPU without one is not.
        by_uuid = {r.uuid: r for r in interval.readings}
        blind = [g for g in gpus if not g.mig_mode and by_uuid[g.uuid].util is None]
        yield Check("Utilization", not blind, ", ".join(parts) or "no devices")
        errors = nvml.take_errors()  # the collector's, before the probe below makes calls of its own
        holder_errors = {k: errors.pop(k) for k in list(errors) if k.startswith("holders:")}
        yield from _privilege_checks(gpus)
        probe = capabilities.report(nvml, gpus, simulated=config.fake_nvml)
        yield from _call_checks(probe)
        reader = collector.device.processes
        if reader.symbol:
            size = f"{reader.record_bytes}-byte records" if reader.record_bytes else "no process to learn the size"
            yield Check("Process lists", True, f"{reader.symbol}, {size}")
        yield _holders_check(config, interval, holder_errors)
        if errors:
            worst = ", ".join(f"{k} x{v}" for k, v in Counter(errors).most_common(3))
            yield Check("NVML calls", True, f"{sum(errors.values())} failed calls, reported as absent: {worst}")
        if report is not None:
            report["report"] = probe
    finally:
        nvml.close()


def _holders_check(config: AgentConfig, interval: Interval, errors: dict[str, int]) -> Check:
    """Whether the processes NVML listed were found in /proc, and what they run in."""
    if not config.holders:
        return Check("Holders", True, "off (GPUFLEET_AGENT_HOLDERS)")
    parents = {g.uuid for g in interval.gpus if g.mig_mode}  # their processes are their slices'
    listed = sum(r.procs or 0 for r in interval.readings if r.uuid not in parents)
    holders = [h for r in interval.readings for h in r.holders]
    if not listed:
        return Check("Holders", True, "no compute process running")
    if not holders and errors.get("holders:exited") == listed:
        return Check(
            "Holders",
            True,
            f"none of the {listed} processes NVML lists is in {config.proc_root}: read the host's /proc "
            "(the host's PID namespace, or GPUFLEET_AGENT_PROC_ROOT)",
            warn=True,
        )
    users = sorted({h.user or str(h.uid) for h in holders if h.uid is not None})
    kinds = [
        (sum(h.job_id is not None for h in holders), "in Slurm jobs"),
        (sum(h.pod_uid is not None for h in holders), "in pods"),
        (sum(h.container_id is not None and h.pod_uid is None for h in holders), "in other containers"),
    ]
    message = f"{len(holders)} of {listed} processes described; users {', '.join(users[:5]) or 'unknown'}"
    message += "".join(f"; {n} {kind}" for n, kind in kinds if n)
    trouble = {k: v for k, v in errors.items() if k not in ("holders:exited", "holders:truncated")}
    if trouble:
        message += "; not read: " + ", ".join(f"{k} x{v}" for k, v in sorted(trouble.items()))
    return Check("Holders", True, message, warn=bool(trouble))


def _privilege_checks(gpus: tuple[GpuInfo, ...]) -> Iterator[Check]:
    """One WARN line per GPU and grant for the figures NVML refused, or one ok line when none was."""
    denied = [g for g in gpus if g.permission_denied]
    if not denied:
        yield Check("Privileges", True, f"every figure readable on {len(gpus)} GPUs")
        return
    for g in denied:
        by_grant: dict[str, list[tuple[str, str]]] = {}
        for d in g.permission_denied:
            by_grant.setdefault(d.grant, []).append((FIGURES.get(d.figure, d.figure), d.call))
        for grant, items in by_grant.items():
            figures = ", ".join(dict.fromkeys(f for f, _ in items))
            calls = ", ".join(dict.fromkeys(c for _, c in items))
            message = f"GPU {g.index}: {figures} refused ({calls}); grant {GRANTS.get(grant, grant)}"
            yield Check("Privileges", True, message, warn=True)


def _call_checks(probe: dict[str, Any]) -> Iterator[Check]:
    """Per GPU: how many of the agent's NVML calls (its slices' included) answered at this privilege, and what
    the others answered; `WARN` where one was refused."""
    for g in probe["gpus"]:
        answers = [*g["calls"].values(), *(a for s in g["slices"] for a in s["calls"].values())]
        others: dict[str, list[str]] = {}
        for calls in [g["calls"], *(s["calls"] for s in g["slices"])]:
            for call, answer in calls.items():
                if answer != "ok" and call not in others.setdefault(answer, []):
                    others[answer].append(call)
        message = f"GPU {g['index']}: {answers.count('ok')} of {len(answers)} answered"
        message += "".join(f"; {answer}: {', '.join(calls)}" for answer, calls in sorted(others.items()))
        yield Check("Calls", True, message, warn="no_permission" in others)


def _identity_check(config: AgentConfig) -> Check:
    from .identify import IdentityResolver, IdentityUnavailable

    resolver = IdentityResolver(config)
    try:
        resolver.identity()
    except IdentityUnavailable as exc:
        return Check("Identity", False, str(exc))
    return Check("Identity", True, resolver.describe())


def _spool_check(config: AgentConfig) -> Check:
    try:
        spool = Spool(config.spool_dir, tidy=False)
        probe = config.spool_dir / ".doctor-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        return Check("Spool", False, f"{config.spool_dir} is not writable: {exc.strerror or exc}")
    waiting, size, rejected = len(spool.pending()), spool.size_bytes(), spool.rejected()
    message = f"{config.spool_dir} writable, {waiting} batches waiting ({size // 1024} KiB)"
    if rejected:
        message += f", {rejected} rejected by the server (see {spool.rejected_dir})"
    aside = len(spool.aside())
    if aside:
        every = f"{ASIDE_RETRY_S / 60:g} min"
        message += f", {aside} set aside after repeated server errors, tried every {every} (see {spool.aside_dir})"
    return Check("Spool", True, message, warn=bool(aside))


def _server_checks(config: AgentConfig) -> Iterator[Check]:
    if config.server_url is None or config.ingest_url is None:
        yield Check("Server", False, "GPUFLEET_AGENT_SERVER_URL is not set")
        return
    try:
        context = tls_context(str(config.ca_bundle) if config.ca_bundle else None)
    except (OSError, ssl.SSLError) as exc:
        yield Check("Server", False, f"cannot load the CA bundle {config.ca_bundle}: {exc}")
        return
    health = config.server_url + "/healthz"
    try:
        answer = request(
            "GET",
            health,
            headers={"User-Agent": f"gpufleet-agent/{__version__}"},
            timeout_s=config.http_timeout_s,
            context=context,
        )
    except HttpError as exc:
        yield Check("Server", False, f"{config.server_url} not reachable: {exc}")
        return
    if answer.status != 200:
        yield Check("Server", False, f"{health} answered HTTP {answer.status}: is this a gpufleet server?")
        return
    yield Check("Server", True, f"{config.server_url} reachable")
    try:
        token = config.bearer_token()
    except ConfigError as exc:
        yield Check("Token", False, str(exc))
        return
    if not token:
        yield Check("Token", False, "no token: set GPUFLEET_AGENT_TOKEN or GPUFLEET_AGENT_TOKEN_FILE")
        return
    poster = Poster(config.ingest_url, token, ca_bundle=config.ca_bundle, timeout_s=config.http_timeout_s)
    outcome = poster.post(json.dumps({}).encode(), gzipped=False)
    if outcome.status == 401:
        yield Check("Token", False, "the server does not know this token (HTTP 401)")
    elif outcome.status == 403:
        yield Check("Token", False, "the token lacks the ingest scope (HTTP 403)")
    elif outcome.status in (400, 422):
        yield Check("Token", True, "accepted for ingest")
    else:
        detail = f"HTTP {outcome.status}" if outcome.status else outcome.message
        yield Check("Token", False, f"could not check the token: {detail}")
