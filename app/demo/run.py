"""`gpufleet demo`: history, server, simulated instance metadata and live agents, started and stopped together.

The demo's folder holds its embedded PostgreSQL, `demo.json` (the fleet's seed, size and epoch), the agents'
ingest token and their state directories. A second start finds the fleet there and tops the history up from
each instance's newest data to the present before the agents carry on; `--reset` (or data older than the raw
retention) starts over with a new epoch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import uvicorn
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from ..alerts.fields import check_url
from ..auth import create_token, hash_secret
from ..db import make_engine, make_sessionmaker, session_scope
from ..main import create_app
from ..migrate import upgrade
from ..models import ApiToken
from ..settings import Settings
from ..store.bulk import quiet_bulk_loads
from ..store.partitions import upkeep
from . import billing, history
from .agents import LiveAgents
from .alerts import IDLE_FOR_HOURS, RULE_NAME, SECRET, PrintingReceiver, install_rule
from .fleet import DAY, DEFAULT_INSTANCES, DEFAULT_SEED, GRID_S, STORIES, STORIES_DIGEST, DemoFleet, make_fleet
from .imds import MetadataServer
from .signer import DEMO_ACCOUNT, IdentitySigner

DAYS = history.DAYS
"""Days of history the demo starts with."""
INTERVALS = (5, 10, 15, 20, 30, 60)
"""Live intervals the demo offers, s: each divides the 5-minute grid of the history."""
DEFAULT_INTERVAL_S = 10
DEMO_ALERTS_CHECK_S = 10.0
"""How often the demo's server evaluates the alert rules, s."""
STATE_FILE = "demo.json"
TOKEN_FILE = "ingest-token"
IDENTITY_CERT_FILE = "identity-cert.pem"
TOKEN_NAME = "demo-agents"

log = logging.getLogger("gpufleet.demo")


class DemoError(Exception):
    """A reason the demo cannot start, as one line."""


@dataclass(frozen=True)
class DemoOptions:
    folder: Path
    instances: int | None = None
    seed: int | None = None
    reset: bool = False
    interval_s: int = DEFAULT_INTERVAL_S
    webhook: str | None = None
    """Where the demo's alert rule sends its messages; None: a receiver of the demo's own prints them."""


def say(message: str) -> None:
    print(f"gpufleet demo: {message}", flush=True)


# --------------------------------------------------------------------------------------------------------------
# The folder: one demo at a time, and what it holds


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold the demo folder for this process: a second demo on the same folder is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "demo.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoError(f"another gpufleet demo is running on {folder}; stop it first") from None
        yield


@contextlib.contextmanager
def listening_socket(host: str, port: int) -> Iterator[socket.socket]:
    """The server's socket, bound before anything slow starts, so a taken port is reported at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DemoError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another with --port") from None
    try:
        yield sock
    finally:
        sock.close()


def read_state(folder: Path) -> dict[str, int] | None:
    """The fleet the folder holds: its size, seed and epoch; None if there is none, or one of other stories."""
    try:
        data = json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("stories") != STORIES_DIGEST:
        return None
    if not all(isinstance(data.get(k), int) for k in ("instances", "seed", "epoch")):
        return None
    return {k: int(data[k]) for k in ("instances", "seed", "epoch")}


def write_state(folder: Path, fleet: DemoFleet) -> None:
    state = {"instances": len(fleet.instances), "seed": fleet.seed, "epoch": fleet.epoch, "stories": STORIES_DIGEST}
    (folder / STATE_FILE).write_text(json.dumps(state) + "\n")


def recreate_database(url: str) -> None:
    """Drop the demo's database and make it again, empty and migrated."""
    parsed = make_url(url)
    admin = parsed.set(database="postgres").render_as_string(hide_password=False)
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{parsed.database}"')
    except psycopg.Error as exc:
        raise DemoError(f"cannot empty the demo's database: {str(exc).strip().splitlines()[0]}") from None
    upgrade(url)


def agent_token(sessions: sessionmaker[Session], path: Path) -> None:
    """An ingest token for the agents in `path` (mode 0600): the one kept there if it is still live, else a
    new one."""
    with contextlib.suppress(OSError):
        secret = path.read_text().strip()
        with session_scope(sessions) as session:
            live = session.scalar(
                select(ApiToken.id).where(
                    ApiToken.secret_sha256 == hash_secret(secret),
                    ApiToken.scope == "ingest",
                    ApiToken.revoked_at.is_(None),
                )
            )
        if live is not None:
            return
    with session_scope(sessions) as session:
        taken = set(session.scalars(select(ApiToken.name).where(ApiToken.name.startswith(TOKEN_NAME))))
        name = next(n for n in (TOKEN_NAME, *(f"{TOKEN_NAME}-{k}" for k in range(2, 10_000))) if n not in taken)
        _token, secret = create_token(session, name=name, scope="ingest")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


# --------------------------------------------------------------------------------------------------------------
# The server, in a thread of this process


class ServerThread:
    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="demo-server", daemon=True
        )

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise DemoError("the server did not start (see the messages above)")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)


# --------------------------------------------------------------------------------------------------------------
# The run


def _ensure_partitions(engine: Engine, settings: Settings, begin: float) -> None:
    """Daily partitions from the day of `begin` (UTC epoch s) to a few days ahead."""
    now = datetime.now(UTC)
    days = (now.date() - datetime.fromtimestamp(begin, UTC).date()).days
    with engine.begin() as conn:
        upkeep(
            conn,
            now=now,
            raw_retention_days=max(settings.raw_retention_days, days),
            rollup_retention_days=settings.rollup_retention_days,
            ahead_days=settings.partitions_ahead_days,
        )


def _choose_fleet(options: DemoOptions, url: str, sessions: sessionmaker[Session]) -> tuple[DemoFleet, bool]:
    """The fleet of the folder, or a new one (True) after wiping the database and the agents' state."""
    state = None if options.reset else read_state(options.folder)
    if state is None and not options.reset and (options.folder / STATE_FILE).exists():
        say(f"the demo in {options.folder} was made by another version of gpufleet: starting over")
    if state is not None:
        for name, given in (("instances", options.instances), ("seed", options.seed)):
            if given is not None and given != state[name]:
                raise DemoError(
                    f"the demo in {options.folder} was made with --{name} {state[name]}; "
                    f"add --reset to start over with --{name} {given}"
                )
        newest = max(history.last_seen(sessions).values(), default=0.0)
        if newest < time.time() - DAYS * DAY + 3600:
            say(f"the demo's data is missing or older than {DAYS} days: starting over")
            state = None
    if state is not None:
        return make_fleet(state["instances"], seed=state["seed"], epoch=state["epoch"]), False
    instances = DEFAULT_INSTANCES if options.instances is None else options.instances
    seed = DEFAULT_SEED if options.seed is None else options.seed
    fleet = make_fleet(instances, seed=seed, epoch=int(time.time()) // GRID_S * GRID_S)
    (options.folder / STATE_FILE).unlink(missing_ok=True)
    recreate_database(url)
    return fleet, True


def _top_up_since(fleet: DemoFleet, starts: dict[str, float]) -> float:
    """Where a top-up starts: the oldest newest data of the instances still running. One that has ended (the
    Capacity Block's) has nothing to top up."""
    ended = {i.instance_id: block.end for i in fleet.instances if (block := fleet.block(i)) is not None}
    going = [t for iid, t in starts.items() if t < ended.get(iid, float("inf"))]
    return min(going or starts.values())


def check_options(options: DemoOptions) -> None:
    if options.instances is not None:
        try:
            make_fleet(options.instances, seed=0, epoch=0)
        except ValueError as exc:
            raise DemoError(str(exc)) from None
    if options.interval_s not in INTERVALS:
        raise DemoError(f"--interval-s must be one of {', '.join(map(str, INTERVALS))}")
    if options.webhook is not None:
        try:
            check_url(options.webhook)
        except ValueError as exc:
            raise DemoError(f"--webhook: {exc}") from None


def run_demo(
    options: DemoOptions,
    settings: Settings,
    sock: socket.socket,
    database: Callable[[Settings], AbstractContextManager[str]],
) -> None:
    """Everything the demo does, until Ctrl-C or SIGTERM; `database` starts the embedded PostgreSQL."""
    logging.getLogger("gpufleet.agent").setLevel(logging.WARNING)
    with database(settings) as url:
        engine = make_engine(url, pool_size=2)
        quiet_bulk_loads(engine)
        try:
            # The demo's bill and spot prices are its own (app/demo/billing.py): none read from AWS beside them.
            update = {"database_url": url, "billing_source": None, "spot_prices": "off"}
            _run(options, settings.model_copy(update=update), sock, engine)
        finally:
            # A second Ctrl-C must not cut the way out short: PostgreSQL has to be stopped.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            engine.dispose()


def _run(options: DemoOptions, settings: Settings, sock: socket.socket, engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    fleet, fresh = _choose_fleet(options, settings.database_url or "", sessions)
    begin = fleet.epoch - DAYS * DAY
    hosts = history.make_hosts(fleet, options.interval_s)
    history.register(sessions, hosts, first=begin)
    gpus = sum(len(h.gpus) for h in hosts)
    slices = sum(len(g["slices"]) for h in hosts for g in h.gpus)
    say(f"{len(fleet.instances)} simulated instances, {gpus} GPUs, {slices} MIG slices (seed {fleet.seed})")

    seen = {} if fresh else history.last_seen(sessions)
    starts = {h.inst.instance_id: seen.get(h.inst.instance_id, float(begin)) for h in hosts}
    _ensure_partitions(engine, settings, min(starts.values()))
    t = time.perf_counter()
    written = history.write_history(
        sessions,
        fleet,
        hosts,
        starts=starts,
        end=time.time(),
        fine_s=options.interval_s,
        mem_held_mib=settings.mem_held_mib,
    )
    took = time.perf_counter() - t
    if fresh:
        write_state(options.folder, fleet)
        say(f"{DAYS} days of history: {written.rows:,} samples written in {took:.1f} s")
    else:
        since = datetime.fromtimestamp(_top_up_since(fleet, starts), UTC)
        say(f"topped up from {since:%Y-%m-%d %H:%M} UTC to now: {written.rows:,} samples in {took:.1f} s")
    shipped = billing.ship_billing(sessions, fleet, options.folder, begin=begin, now=time.time())

    token_file = options.folder / TOKEN_FILE
    agent_token(sessions, token_file)
    # The agents authenticate with their signed instance identity, signed by a key of the demo's own that the
    # server trusts beside AWS's (docs/ingest-protocol.md, "Authentication"); the token stays as their fallback.
    receiver = None if options.webhook else PrintingReceiver(lambda line: say(f"alert: {line}")).start()
    alerts_to = options.webhook or (receiver.url if receiver else "")
    with session_scope(sessions) as session:
        install_rule(session, alerts_to, now=datetime.now(UTC))
    signer = IdentitySigner()
    metadata = MetadataServer({i.instance_id: (i.metadata(), i.tags) for i in fleet.instances}, signer=signer).start()
    trusted = signer.write_certificate(options.folder / IDENTITY_CERT_FILE)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}/"
    identity = {"identity_accounts": [DEMO_ACCOUNT], "identity_extra_certs": trusted}
    # Rules are evaluated more often than a server's default minute, so the first alert comes within seconds.
    alerting = {"alerts_check_s": DEMO_ALERTS_CHECK_S, "public_url": url}
    server = ServerThread(settings.model_copy(update=identity | alerting), sock)
    agents = LiveAgents(
        fleet,
        server_url=url.rstrip("/"),
        token_file=token_file,
        metadata=metadata,
        state_dir=options.folder / "agents",
        interval_s=options.interval_s,
    )
    agents.clear_state()
    try:
        server.start()
        # The seconds since the history ended, so the live data follows it without a gap.
        history.write_history(
            sessions,
            fleet,
            hosts,
            starts=history.last_seen(sessions),
            end=time.time(),
            fine_s=options.interval_s,
            mem_held_mib=settings.mem_held_mib,
        )
        agents.sync(time.time())
        _legend(fleet, agents, options.interval_s, url, shipped)
        _alerts_legend(options.webhook, url)
        say(f"open {url}  (Ctrl-C stops the agents, the server and PostgreSQL)")
        while True:
            time.sleep(2.0)
            agents.sync(time.time())
    finally:
        agents.stop()
        server.stop()
        metadata.stop()
        if receiver is not None:
            receiver.stop()


def _alerts_legend(webhook: str | None, url: str) -> None:
    where = f"to {webhook}, signed with the secret {SECRET!r}" if webhook else "here, as lines starting 'alert:'"
    say(
        f"alerts: the rule {RULE_NAME!r} reports GPUs idle {IDLE_FOR_HOURS:g} h or more {where} "
        f"(docs/alerts.md); rules, incidents and deliveries: {url}alerts"
    )


def _legend(fleet: DemoFleet, agents: LiveAgents, interval_s: int, url: str, shipped: billing.Shipped) -> None:
    say(
        f"{agents.running} agents post every {interval_s} s through the ingest API with their signed instance "
        "identity: the real gpufleet-agent, on simulated NVML and instance metadata"
    )
    say("reading needs no login here (GPUFLEET_AUTH=off: this machine only)")
    say("the stories:")
    for story, inst in zip(STORIES, fleet.instances, strict=False):
        if story.legend and story.page:
            print(f"  - {story.legend}: {story.page.format(instance_id=inst.instance_id)}", flush=True)
    extra = len(fleet.instances) - len(STORIES)
    if extra > 0:
        print(f"  - and {extra} more instances at work in the background", flush=True)
    say("over time: the overview charts GPU-hours by state and compares each figure with the previous window;")
    print("  /heatmap?window=7d draws every instance hour by hour (rows=gpu or rows=tag:team for others)", flush=True)
    say("who leaves GPUs idle: /waste?group_by=user splits the waste by whose processes held each GPU;")
    print(
        "  asmith's idle notebook, mchen's Slurm job on the p4d nodes, root's vLLM pods on the p5's slices, and "
        "(none) for time no process held (also group_by=process, container, namespace, pod or job)",
        flush=True,
    )
    say(f"the same as a report: curl '{url}api/v1/report?window=7d&group_by=user'")
    say(f"every page also answers JSON: curl -H 'Accept: application/json' {url}gpus/idle")
    say(shipped.summary(url))
    print(
        f"  the bill is a simulated CUR 2.0 export (in {shipped.root}), a day behind as AWS's; the spot hours it has "
        f"not reached are priced from a simulated EC2 spot price history of {shipped.pools} pools (no AWS is asked)",
        flush=True,
    )
    say(f"what each instance cost and from which prices: curl '{url}api/v1/report?window=30d&group_by=instance'")
