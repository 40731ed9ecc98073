"""`gpufleet-agent`: run (the service), once (one interval as JSON, no network), doctor, install.

Every failure ends as one readable line on stderr and a non-zero exit code, never a traceback:
2 for configuration and usage, 3 when NVML cannot be used, 1 when `doctor` finds a problem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__
from .config import AgentConfig, ConfigError, load_config

EXIT_FAIL = 1
EXIT_CONFIG = 2
EXIT_NVML = 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet-agent", description="GPU and MIG-slice utilization agent.")
    parser.add_argument("--version", action="version", version=f"gpufleet-agent {__version__}")
    parser.add_argument("--config", type=Path, help="env file to read (default /etc/gpufleet/agent.env)")
    parser.add_argument("--fake-nvml", metavar="SCENARIO", help="use a simulated GPU host (tests and demos)")
    parser.add_argument(
        "--fake-clock",
        type=_utc_time,
        metavar="TIME",
        help="with --fake-nvml: the simulated host's clock starts at this UTC time, e.g. 2026-11-24T15:00:00Z "
        "(scenarios with office hours)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("run", help="collect and deliver until stopped (the systemd service)")
    once = sub.add_parser("once", help="collect one interval and print the batch as JSON; no network")
    once.add_argument("--interval", type=float, metavar="SECONDS", help="interval length (default: configured)")
    doctor = sub.add_parser(
        "doctor", help="check NVML, GPUs, instance identity, spool and server; non-zero on a problem"
    )
    doctor.add_argument(
        "--json", action="store_true", help="print the checks and this host's capability report as JSON"
    )
    install = sub.add_parser("install", help="write the systemd unit and env file, and enable the service")
    install.add_argument("--server-url", help="written to the env file as GPUFLEET_AGENT_SERVER_URL")
    install.add_argument("--token", help="written to the env file as GPUFLEET_AGENT_TOKEN")
    install.add_argument("--start", action="store_true", help="start the service now, not only at next boot")
    install.add_argument("--no-enable", action="store_true", help="write the files only")
    install.add_argument("--force", action="store_true", help="overwrite an existing env file")
    install.add_argument(
        "--profiling",
        action="store_true",
        help="also give the agent CAP_SYS_ADMIN (a drop-in) for GPM: SM activity and H100/H200 slice utilization",
    )
    install.add_argument("--root", type=Path, default=Path("/"), help="install into this root (image builds)")
    install.add_argument(
        "--exec-path", help="absolute path of gpufleet-agent as the unit will see it (default: this program)"
    )
    return parser


def _utc_time(text: str) -> float:
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time like 2026-11-24T15:00:00Z, got {text!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _setup_logging(level: str, *, stream: Any = None) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=stream or sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
        force=True,
    )


def _config(args: argparse.Namespace) -> AgentConfig:
    return load_config(config_file=args.config, overrides={"fake_nvml": args.fake_nvml})


def _open_nvml(config: AgentConfig, fake_start: float | None = None) -> Any:
    from .nvml import Nvml, NvmlUnavailable, load_library

    try:
        lib = load_library(config.fake_nvml, start=fake_start)
    except NvmlUnavailable as exc:
        # A scenario that does not exist, or a report that cannot be read, is bad input, not a driver problem.
        raise CliError(str(exc), EXIT_CONFIG if config.fake_nvml else EXIT_NVML) from None
    try:
        return Nvml.open(lib)
    except NvmlUnavailable as exc:
        raise CliError(str(exc), EXIT_NVML) from None


def cmd_run(args: argparse.Namespace) -> int:
    from .identify import IdentityResolver
    from .run import Agent

    config = _config(args)
    _setup_logging(config.log_level)
    if config.server_url is None:
        raise CliError("GPUFLEET_AGENT_SERVER_URL is not set (in /etc/gpufleet/agent.env or the environment)")
    if not config.bearer_token():
        if config.imds == "off":
            raise CliError("no ingest token: set GPUFLEET_AGENT_TOKEN or GPUFLEET_AGENT_TOKEN_FILE")
        # On EC2 the signed instance identity may authenticate alone (docs/agent.md, "Configuration").
        logging.getLogger("gpufleet.agent").info(
            "no ingest token: batches carry only the instance's signed identity, which the server must accept"
        )
    if config.server_url.startswith("http://") and not _loopback(config.server_url):
        logging.getLogger("gpufleet.agent").warning(
            "GPUFLEET_AGENT_SERVER_URL is plain http: the token and the data cross the network unencrypted"
        )
    nvml = _open_nvml(config, args.fake_clock)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        agent = Agent(config, nvml, IdentityResolver(config))
        agent.run(stop)
    except OSError as exc:
        raise CliError(f"cannot use the state directory {config.state_dir}: {exc.strerror or exc}") from None
    finally:
        nvml.close()
    return 0


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    return (urlsplit(url).hostname or "") in ("127.0.0.1", "::1", "localhost")


def cmd_once(args: argparse.Namespace) -> int:
    from .batch import HolderTable, build_batch
    from .collect import Collector
    from .identify import IdentityResolver, IdentityUnavailable
    from .run import holder_reader
    from .spool import new_batch_id

    config = _config(args)
    _setup_logging("warning" if config.log_level == "info" else config.log_level)
    seconds = args.interval if args.interval is not None else config.interval_s
    if not seconds > 0:
        raise CliError("--interval must be above 0")
    nvml = _open_nvml(config, args.fake_clock)
    try:
        interval = Collector(nvml, holders=holder_reader(config, nvml.lib)).sample(seconds)
        try:
            instance = IdentityResolver(config).identity().to_wire()
        except IdentityUnavailable as exc:
            raise CliError(f"instance identity: {exc}", EXIT_FAIL) from None
        holders = HolderTable()
        samples = interval.to_wire(holders.refs)
        errors = nvml.take_errors()
        if holders.truncated:
            errors["holders:truncated"] = errors.get("holders:truncated", 0) + holders.truncated
        document = build_batch(
            batch_id=new_batch_id(),
            instance=instance,
            gpus=[g.to_wire() for g in interval.gpus],
            intervals=[samples],
            events=[],
            interval_s=seconds,
            errors=errors,
            holders=holders.entries,
        )
    finally:
        nvml.close()
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    config = _config(args)
    _setup_logging("error")
    failed = 0
    if args.json:
        holder: dict[str, Any] = {}
        checks = list(run_checks(config, holder))
        document = holder.get("report") or {"format": "gpufleet-capability-report", "version": 1, "gpus": []}
        document["checks"] = [c.to_wire() for c in checks]
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_FAIL if any(not c.ok for c in checks) else 0
    for check in run_checks(config):
        print(f"{check.status.upper() if check.status != 'ok' else 'ok  '}  {check.name}: {check.message}", flush=True)
        failed += not check.ok
    return EXIT_FAIL if failed else 0


def cmd_install(args: argparse.Namespace) -> int:
    from .install import InstallError, install

    # This program's own path first: sudo resets PATH, and a second install elsewhere must not win.
    own = os.path.abspath(sys.argv[0])
    exec_path = args.exec_path or (own if os.path.basename(own) == "gpufleet-agent" else None)
    exec_path = exec_path or shutil.which("gpufleet-agent") or own
    try:
        result = install(
            root=args.root,
            exec_path=exec_path,
            server_url=args.server_url,
            token=args.token,
            force=args.force,
            enable=not args.no_enable,
            start=args.start,
            profiling=args.profiling,
        )
    except InstallError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    for line in result.actions:
        print(line)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "once": cmd_once,
    "doctor": cmd_doctor,
    "install": cmd_install,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"gpufleet-agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CliError as exc:
        print(f"gpufleet-agent: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_FAIL
    except Exception as exc:  # the last guard: one line for the operator, the trace for debugging
        logging.getLogger("gpufleet.agent").debug("unexpected failure", exc_info=True)
        print(f"gpufleet-agent: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
