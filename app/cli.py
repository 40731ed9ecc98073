"""`gpufleet`: serve, demo, migrate, token create/list/revoke, hash-password, maintain, prices, report, billing import.

Every failure ends in one readable line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from ipaddress import ip_address
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from . import __version__
from .settings import Settings

if TYPE_CHECKING:
    from .alerts.rules import Rule
    from .pricing import PriceConfig


class CliError(Exception):
    """A failure to report as one line, with exit code `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int = 2) -> NoReturn:
    raise CliError(message, code)


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"bad setting GPUFLEET_{str(first['loc'][0]).upper()}: {first['msg']}")


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


@contextmanager
def database(settings: Settings, *, announce: bool = False) -> Iterator[str]:
    """The configured database URL, or an embedded server started for the duration of the block."""
    if settings.database_url:
        yield settings.database_url
        return
    from .embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(settings.data_dir)
    try:
        url = embedded.start()
    except Exception as exc:  # pgserver raises plain exceptions of several kinds
        _fail(f"could not start the embedded PostgreSQL in {embedded.pgdata}: {exc}".splitlines()[0])
    if announce:
        print(f"gpufleet: data in {embedded.pgdata} (embedded PostgreSQL; stops when gpufleet stops)", flush=True)
    try:
        # The embedded database is ours: bring its schema up to date whatever the command.
        _migrate(url)
        yield url
    finally:
        embedded.stop()


def _migrate(url: str) -> None:
    from .migrate import upgrade

    upgrade(url)


class _Terminated(Exception):
    """SIGTERM arrived: unwind so the embedded database is stopped on the way out."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise _Terminated


METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`: an address only this machine can reach."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


AUTH_OFF_WARNING = """\
gpufleet: ****************************************************************************
gpufleet: WARNING: authentication is OFF (GPUFLEET_AUTH=off).
gpufleet: Anyone on this machine can read the dashboard, the report and /metrics
gpufleet: without a token or a login. Ingest still needs a token of scope ingest.
gpufleet: Use this for a demo on a laptop only. docs/security.md, "GPUFLEET_AUTH=off".
gpufleet: ****************************************************************************"""


def _check_auth(settings: Settings) -> None:
    """With auth off: refuse a non-loopback address (one line, exit 2), else print the warning to stderr."""
    if settings.auth != "off":
        return
    if not is_loopback_host(settings.host):
        _fail(
            f"GPUFLEET_AUTH=off is refused on {settings.host}: it serves the fleet's data without credentials; "
            "bind 127.0.0.1, ::1 or localhost, or turn auth on"
        )
    print(AUTH_OFF_WARNING, file=sys.stderr, flush=True)


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    # uvicorn shuts down gracefully on SIGTERM, then re-raises it; this handler turns that into an unwind.
    signal.signal(signal.SIGTERM, _on_sigterm)

    settings = _settings(args)
    _check_prices(settings)
    alert_rules = _check_rule_file(settings)
    _check_auth(settings)
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("gpufleet").info("listening on %s: put a TLS-terminating proxy in front", settings.host)
    # With trusted proxies, the peer address must stay the proxy's own: uvicorn would otherwise replace it with
    # X-Forwarded-For from a proxy on 127.0.0.1, and the user header would be checked against the wrong address.
    proxy_headers = not settings.trusted_proxies
    with database(settings, announce=True) as url:
        _migrate(url)
        _sync_rule_file(url, alert_rules)
        settings = settings.model_copy(update={"database_url": url})
        shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
        print(f"gpufleet: serving on http://{shown}:{settings.port}/ (Ctrl-C stops)", flush=True)
        if settings.workers > 1:
            os.environ["GPUFLEET_DATABASE_URL"] = url
            # Each worker keeps its metric counters in files here and a scrape of any worker sums them all
            # (prometheus_client's multiprocess mode, docs/metrics.md); a fresh folder per run, so no stale counts.
            with tempfile.TemporaryDirectory(prefix="gpufleet-metrics-") as metrics_dir:
                os.environ[METRICS_DIR_ENV] = metrics_dir
                uvicorn.run(
                    "app.asgi:app",
                    host=settings.host,
                    port=settings.port,
                    workers=settings.workers,
                    access_log=settings.access_log,
                    proxy_headers=proxy_headers,
                )
        else:
            # One process counts in memory; a leftover folder from the environment would only mix in old files.
            os.environ.pop(METRICS_DIR_ENV, None)
            from .main import create_app

            uvicorn.run(
                create_app(settings),
                host=settings.host,
                port=settings.port,
                access_log=settings.access_log,
                proxy_headers=proxy_headers,
            )
    print("gpufleet: stopped", flush=True)


def _serve(args: argparse.Namespace) -> None:
    try:
        cmd_serve(args)
    except (_Terminated, KeyboardInterrupt):
        print("gpufleet: stopped", flush=True)


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo.run import DemoError, DemoOptions, check_options, folder_lock, listening_socket, run_demo

    signal.signal(signal.SIGTERM, _on_sigterm)
    settings = _settings(args)
    folder = Path(args.demo_dir).expanduser() if args.demo_dir else settings.data_dir / "demo"
    options = DemoOptions(
        folder=folder.resolve(),
        instances=args.instances,
        seed=args.seed,
        reset=args.reset,
        interval_s=args.interval_s,
        webhook=args.webhook,
    )
    if settings.database_url:
        print("gpufleet demo: GPUFLEET_DATABASE_URL is not used: the demo keeps its own database", file=sys.stderr)
    # Always its own embedded database, on loopback, with reading open to this machine only.
    settings = settings.model_copy(
        update={"database_url": None, "data_dir": options.folder, "host": "127.0.0.1", "auth": "off"}
    )
    _check_prices(settings)
    try:
        check_options(options)
        with folder_lock(options.folder), listening_socket(settings.host, settings.port) as sock:
            _check_auth(settings)
            run_demo(options, settings, sock, lambda s: database(s, announce=True))
    except DemoError as exc:
        _fail(str(exc))


def _demo(args: argparse.Namespace) -> None:
    try:
        cmd_demo(args)
    except (_Terminated, KeyboardInterrupt):
        print("gpufleet demo: stopped", flush=True)


def cmd_migrate(args: argparse.Namespace) -> None:
    settings = _settings(args)
    from .migrate import head_revision

    with database(settings) as url:
        _migrate(url)
        print(f"gpufleet: database {_safe_url(url)} is at schema {head_revision()}")


def cmd_maintain(args: argparse.Namespace) -> None:
    from .db import make_engine
    from .main import run_upkeep

    settings = _settings(args)
    with database(settings) as url:
        engine = make_engine(url, pool_size=1)
        try:
            run_upkeep(engine, settings)
        finally:
            engine.dispose()
    print("gpufleet: partitions made ahead and expired ones dropped")


def _with_session(args: argparse.Namespace, work: Callable[..., None]) -> None:
    from .db import make_engine, make_sessionmaker, session_scope

    settings = _settings(args)
    with database(settings) as url:
        engine = make_engine(url, pool_size=1)
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                work(session)
        finally:
            engine.dispose()


def cmd_token_create(args: argparse.Namespace) -> None:
    from .auth import create_token

    def work(session: object) -> None:
        try:
            token, secret = create_token(
                session,  # type: ignore[arg-type]
                name=args.name,
                scope=args.scope,
                instance_id=args.instance,
            )
        except ValueError as exc:
            _fail(str(exc))
        print(secret)
        bound = f", reports only instance {token.instance_id}" if token.instance_id else ""
        print(
            f"gpufleet: token {token.name!r} (scope {token.scope}{bound}) created; the secret above is shown only once",
            file=sys.stderr,
        )

    _with_session(args, work)


def cmd_token_list(args: argparse.Namespace) -> None:
    from .auth import list_tokens

    def work(session: object) -> None:
        tokens = list_tokens(session)  # type: ignore[arg-type]
        print(f"{'ID':>4}  {'NAME':<24} {'SCOPE':<7} {'HINT':<11} {'CREATED':<20} {'LAST USED':<20} STATUS")
        for t in tokens:
            status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
            if t.instance_id:
                status += f", instance {t.instance_id}"
            used = f"{t.last_used_at:%Y-%m-%d %H:%M:%S}" if t.last_used_at else "never"
            print(
                f"{t.id:>4}  {t.name:<24} {t.scope:<7} {t.hint + '...':<11} {t.created_at:%Y-%m-%d %H:%M:%S}  "
                f"{used:<20} {status}"
            )

    _with_session(args, work)


def cmd_token_revoke(args: argparse.Namespace) -> None:
    from .auth import revoke_token

    def work(session: object) -> None:
        token = revoke_token(session, args.token, now=datetime.now(UTC))  # type: ignore[arg-type]
        if token is None:
            _fail(f"no token named or numbered {args.token!r}")
        print(f"gpufleet: token {token.name!r} revoked")

    _with_session(args, work)


def cmd_hash_password(_args: argparse.Namespace) -> None:
    from .passwords import hash_password

    if sys.stdin.isatty():
        import getpass

        password = getpass.getpass("Admin password: ")
        if getpass.getpass("Same again: ") != password:
            _fail("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    try:
        print(hash_password(password))
    except ValueError as exc:
        _fail(str(exc))
    print("gpufleet: set GPUFLEET_ADMIN_PASSWORD_HASH to the line above", file=sys.stderr)


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _check_prices(settings: Settings) -> PriceConfig:
    """The price file, or one line and exit 2: the server must not start with prices it cannot read."""
    from .pricing import PriceConfigError, load_price_config

    try:
        return load_price_config(settings.prices_file)
    except PriceConfigError as exc:
        _fail(f"bad price file {exc.path}: {exc.problem}")


def _check_rule_file(settings: Settings) -> list[Rule]:
    """The alert rule file's rules (none without a file), or one line naming the line at fault and exit 2."""
    from .alerts.rule_file import RuleFileError, load_rule_file

    if settings.alerts_file is None:
        return []
    try:
        return load_rule_file(settings.alerts_file)
    except RuleFileError as exc:
        _fail(f"bad alert rule file {exc}")


def _sync_rule_file(url: str, rules: list[Rule]) -> None:
    """Make the database's file rules those of the rule file (none without one); one line and exit 2 for a rule
    whose name a rule made through the API or the page already has."""
    from .alerts.rule_file import RuleFileError, sync_rule_file
    from .db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(url, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            result = sync_rule_file(session, rules, now=datetime.now(UTC))
    except RuleFileError as exc:
        _fail(f"bad alert rule file {exc}")
    finally:
        engine.dispose()
    changes = [f"{len(names)} {what}" for what, names in vars(result).items() if names]
    if changes:
        logging.getLogger("gpufleet").info("alert rule file: %s", ", ".join(changes))


def cmd_prices(args: argparse.Namespace) -> None:
    from .pricing import Pricer

    settings = _settings(args)
    config = _check_prices(settings)
    pricer = Pricer(config)
    names = list(pricer.catalog) + sorted(set(config.instance_types) - set(pricer.catalog))
    rows = []
    for name in names:
        on_demand = pricer.price(instance_type=name, lifecycle="on-demand", agent_usd_per_hour=None, gpus_seen=0)
        spot = pricer.price(instance_type=name, lifecycle="spot", agent_usd_per_hour=None, gpus_seen=0)
        source = on_demand.source
        if not spot.source.startswith(source):
            source += f"; spot: {spot.source}"
        gpus = "-" if on_demand.gpus is None else str(on_demand.gpus)
        model = pricer.gpu_model(name) or "-"
        usd = _money(on_demand.usd_per_instance_hour)
        rows.append((name, model, gpus, usd, _money(on_demand.usd_per_gpu_hour), _money(spot.usd_per_gpu_hour), source))
    width = max(len("TYPE"), *(len(r[0]) for r in rows))
    model_width = max(len("GPU MODEL"), *(len(r[1]) for r in rows))
    print(f"{'TYPE':<{width}}  {'GPU MODEL':<{model_width}}  GPUS  {'USD/H':>10}  USD/GPU-H  SPOT USD/GPU-H  SOURCE")
    for name, model, gpus, usd, per_gpu, spot_per_gpu, source in rows:
        print(
            f"{name:<{width}}  {model:<{model_width}}  {gpus:>4}  {usd:>10}  {per_gpu:>9}  {spot_per_gpu:>14}  {source}"
        )
    origin = f"price file {settings.prices_file}" if settings.prices_file else "no price file"
    spot_rule = (
        "spot shown at on-demand prices (spot_discount_pct not set)"
        if config.spot_discount_pct is None
        else f"spot is on-demand less {config.spot_discount_pct:g}% where no spot price is set"
    )
    print(f"gpufleet: USD; catalog: us-east-1 Linux list prices; {origin}; {spot_rule}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> None:
    from .report import client

    try:
        server = client.resolve_server(args.url, args.token, args.token_file, args.timeout)
        params = client.query(
            start=args.start,
            end=args.end,
            window=args.window,
            group_by=args.group_by or (),
            region=args.region or (),
            instance_type=args.instance_type or (),
            lifecycle=args.lifecycle or (),
            tag=args.tag or (),
            fmt="csv" if args.format == "csv" else "json",
        )
        if args.format == "csv":
            client.copy_csv(server, params, sys.stdout)
        elif args.format == "json":
            print(json.dumps(client.fetch_json(server, params), indent=2, ensure_ascii=False))
        else:
            print("\n".join(client.render_table(client.fetch_json(server, params))))
        sys.stdout.flush()
    except client.ReportClientError as exc:
        _fail(str(exc), exc.code)
    except BrokenPipeError:
        # The reader (`| head`) has gone: nothing left to say, and nothing to flush at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value == round(value) else f"{value:,.2f}"


def cmd_billing_import(args: argparse.Namespace) -> None:
    from .billing.cur import CurError
    from .billing.imports import ExportResult, import_source
    from .billing.sources import SourceError

    results: list[ExportResult] = []

    def work(session: object) -> None:
        try:
            results.extend(import_source(session, args.source))  # type: ignore[arg-type]
        except (CurError, SourceError) as exc:
            _fail(str(exc))

    # Printed once the transaction has committed: a line says what the database now holds.
    _with_session(args, work)
    for r in results:
        export = f"{r.billing_period:%Y-%m} payer {r.payer_account}"
        newest = f"newest hour {r.newest_hour:%Y-%m-%d %H:%M} UTC" if r.newest_hour else "no GPU instance-hours"
        print(f"{export}: {_hours(r.instance_hours)} instance-hours, ${r.usd:,.2f}, {newest} ({r.status})")
        for warning in r.warnings:
            print(f"gpufleet: {export}: {warning}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from .demo.fleet import DEFAULT_INSTANCES, STORIES

    parser = argparse.ArgumentParser(prog="gpufleet", description="gpufleet server: where GPU money goes.")
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def db_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--database-url", help="PostgreSQL URL (default: GPUFLEET_DATABASE_URL, else embedded)")
        p.add_argument("--data-dir", help="embedded PostgreSQL folder (default: GPUFLEET_DATA_DIR)")

    p = sub.add_parser("serve", help="run the server (starts an embedded PostgreSQL if no database URL)")
    db_args(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--workers", type=int, help="worker processes (default 1)")
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "demo",
        help="a simulated fleet on this machine: two weeks of history, live agents, the dashboard",
        description="Starts an embedded PostgreSQL, fills in 14 days of a simulated fleet, keeps it live with "
        "simulated agents and serves the dashboard on 127.0.0.1 with reading open to this machine "
        "(GPUFLEET_AUTH=off). Ctrl-C stops everything it started. A second run carries on with the same fleet.",
    )
    p.add_argument(
        "--instances",
        type=int,
        metavar="N",
        help=f"simulated instances (default {DEFAULT_INSTANCES}; the first {len(STORIES)} tell the stories)",
    )
    p.add_argument("--seed", type=int, help="fleet seed: the same seed gives the same fleet (default 1)")
    p.add_argument("--reset", action="store_true", help="delete the demo's data and start over")
    p.add_argument(
        "--data-dir", dest="demo_dir", metavar="DIR", help="the demo's folder (default: GPUFLEET_DATA_DIR/demo)"
    )
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default 8000)")
    p.add_argument("--interval-s", type=int, default=10, metavar="S", help="live agents' interval, s (default 10)")
    p.add_argument(
        "--webhook",
        metavar="URL",
        help="send the demo's alerts to this URL, signed (docs/alerts.md); default: print them in the log",
    )
    p.set_defaults(func=_demo)

    p = sub.add_parser("migrate", help="apply database migrations")
    db_args(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("maintain", help="make partitions ahead and drop expired ones (the server does it too)")
    db_args(p)
    p.set_defaults(func=cmd_maintain)

    p = sub.add_parser("prices", help="show the price per GPU-hour of every instance type and its source")
    p.add_argument("--file", dest="prices_file", metavar="PATH", help="TOML price file (default: GPUFLEET_PRICES_FILE)")
    p.set_defaults(func=cmd_prices)

    token = sub.add_parser("token", help="API tokens").add_subparsers(
        dest="token_command", required=True, metavar="ACTION"
    )
    p = token.add_parser("create", help="create a token and print its secret once")
    db_args(p)
    p.add_argument("--name", required=True)
    p.add_argument("--scope", required=True, choices=["ingest", "read", "admin"])
    p.add_argument(
        "--instance",
        metavar="ID",
        help="ingest only: the one instance (i-...) this token may report; without it the token is fleet-wide",
    )
    p.set_defaults(func=cmd_token_create)
    p = token.add_parser("list", help="list tokens (secrets are never shown)")
    db_args(p)
    p.set_defaults(func=cmd_token_list)
    p = token.add_parser("revoke", help="revoke a token by name or id")
    db_args(p)
    p.add_argument("token", help="token name or id")
    p.set_defaults(func=cmd_token_revoke)

    p = sub.add_parser(
        "hash-password",
        help="hash a dashboard admin password for GPUFLEET_ADMIN_PASSWORD_HASH",
        description="Reads the password from the terminal (twice) or one line of stdin; prints its scrypt hash.",
    )
    p.set_defaults(func=cmd_hash_password)

    p = sub.add_parser(
        "report",
        help="print the utilization and cost report of a running server (docs/report.md)",
        description="GET /api/v1/report from a running server and print it. Filters and --group-by repeat.",
    )
    p.add_argument("--url", help="server URL (default: GPUFLEET_URL, else http://127.0.0.1:8000)")
    p.add_argument("--token", help="token with the read scope (default: GPUFLEET_TOKEN; none: ask without one)")
    p.add_argument("--token-file", metavar="PATH", help="file holding the token")
    p.add_argument("--start", help="ISO 8601 start of the window (default: the last 7 days)")
    p.add_argument("--end", help="ISO 8601 end of the window (default: now)")
    p.add_argument("--window", help="instead of --start/--end: 1h, 6h, 24h, 7d or 30d")
    p.add_argument(
        "--group-by",
        action="append",
        metavar="NAME",
        help="instance, instance_type, region, availability_zone, lifecycle, gpu, slice, gpu_model, tag:KEY, "
        "or who held the GPU: user, process, container, namespace, pod, job (default: instance_type)",
    )
    p.add_argument("--region", action="append", help="only this region")
    p.add_argument("--instance-type", action="append", help="only this instance type")
    p.add_argument("--lifecycle", action="append", help="only this lifecycle: spot, on-demand, on-prem")
    p.add_argument("--tag", action="append", metavar="KEY:VALUE", help="only instances with this tag")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output (default table)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for the server")
    p.set_defaults(func=cmd_report)

    billing = sub.add_parser("billing", help="the AWS bill: Cost and Usage Report 2.0 exports (docs/billing.md)")
    actions = billing.add_subparsers(dest="billing_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "import",
        help="store what the bill says each GPU instance cost per hour",
        description="Reads a CUR 2.0 export (AWS Data Exports: Parquet, hourly, with resource IDs) from a folder or "
        "s3://BUCKET/PREFIX, keeps the EC2 instance-hours of GPU instance types and stores each one's effective "
        "cost. The newest delivery of each month replaces the one before; an unchanged export changes nothing.",
    )
    db_args(p)
    p.add_argument("source", metavar="SOURCE", help="folder, Parquet file, or s3://BUCKET/PREFIX of the export")
    p.set_defaults(func=cmd_billing_import)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="gpufleet: %(message)s")
    for noisy in ("alembic", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CliError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return exc.code
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        print(f"gpufleet: cannot reach the database: {reason}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        print(f"gpufleet: database error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
