"""Agent settings: `/etc/gpufleet/agent.env` (KEY=VALUE lines), then the environment, which wins.

Every setting is a `GPUFLEET_AGENT_*` variable; `docs/agent.md` lists them. A bad value is a `ConfigError`
whose message names the variable, so the command line can print it as one line.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_CONFIG_FILE = Path("/etc/gpufleet/agent.env")
DEFAULT_STATE_DIR = Path("/var/lib/gpufleet-agent")
DEFAULT_PROC_ROOT = Path("/proc")
DEFAULT_PODS_ROOT = Path("/var/log/pods")  # where kubelet writes pod logs, one folder per pod
PREFIX = "GPUFLEET_AGENT_"
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")


class ConfigError(Exception):
    """A setting that cannot be used; the message is one line naming the variable."""


@dataclass(frozen=True)
class AgentConfig:
    """What the agent needs to run. Units are in the names (s, MiB, h)."""

    server_url: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    ca_bundle: Path | None = None
    interval_s: float = 10.0
    batch_intervals: int = 3
    state_dir: Path = DEFAULT_STATE_DIR
    spool_max_mib: float = 256.0
    spool_max_age_h: float = 168.0
    http_timeout_s: float = 10.0
    backoff_max_s: float = 300.0
    imds: str = "auto"
    imds_url: str = "http://169.254.169.254"
    imds_timeout_s: float = 1.0
    host_id: str | None = None
    instance_type: str | None = None
    region: str | None = None
    price_usd_per_hour: float | None = None
    tags: dict[str, str] = field(default_factory=dict)
    holders: bool = True
    holder_args: bool = False
    proc_root: Path = DEFAULT_PROC_ROOT
    pods_root: Path = DEFAULT_PODS_ROOT
    fake_nvml: str | None = None
    log_level: str = "info"

    @property
    def spool_dir(self) -> Path:
        return self.state_dir / "spool"

    @property
    def ingest_url(self) -> str | None:
        return None if self.server_url is None else self.server_url.rstrip("/") + "/api/v1/ingest"

    def bearer_token(self) -> str | None:
        """The ingest token: GPUFLEET_AGENT_TOKEN, else the first line of GPUFLEET_AGENT_TOKEN_FILE."""
        if self.token:
            return self.token
        if self.token_file is None:
            return None
        try:
            text = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"GPUFLEET_AGENT_TOKEN_FILE: cannot read {self.token_file}: {exc.strerror}") from None
        return text.splitlines()[0].strip() if text else None

    def host_name(self) -> str:
        return socket.gethostname()


HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What the server takes as an instance id off EC2: letters, digits, '.', '_' and '-', first a letter or digit."""


def host_id_from_name(name: str) -> str | None:
    """A host name made into a host id (characters outside HOST_ID become '-'); None if nothing usable is left."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", name.strip()).lstrip("._-")[:128]
    return cleaned or None


def parse_env_file(text: str, *, source: str = "agent.env") -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile reads them: comments, blank lines, optional quotes."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.replace("_", "").isalnum():
            raise ConfigError(f"{source} line {number}: expected KEY=VALUE, got {raw.strip()[:60]!r}")
        value = value.strip()
        if value[:1] in ("'", '"'):
            try:
                parts = shlex.split(value)
            except ValueError:
                raise ConfigError(f"{source} line {number}: unbalanced quotes in {key}") from None
            value = parts[0] if parts else ""
        values[key] = value
    return values


def _positive(name: str, minimum: float = 0.0) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}: expected a number, got {text!r}") from None
        if not value > minimum or value != value or value == float("inf"):
            raise ConfigError(f"{PREFIX}{name}: must be a number above {minimum:g}, got {text!r}")
        return value

    return convert


def _int(name: str, low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}: expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise ConfigError(f"{PREFIX}{name}: must be between {low} and {high}, got {value}")
        return value

    return convert


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{PREFIX}SERVER_URL: expected http(s)://host[:port], got {text!r}")
    return text.rstrip("/")


def _imds_mode(text: str) -> str:
    mode = text.strip().lower()
    aliases = {"auto": "auto", "on": "on", "true": "on", "1": "on", "off": "off", "false": "off", "0": "off"}
    if mode not in aliases:
        raise ConfigError(f"{PREFIX}IMDS: expected auto, on or off, got {text!r}")
    return aliases[mode]


def _tags(text: str) -> dict[str, str]:
    """`team=ml,env=prod` (on-premises hosts have no EC2 tags)."""
    tags: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{PREFIX}TAGS: expected key=value[,key=value...], got {item!r}")
        tags[key.strip()] = value.strip()
    return tags


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{PREFIX}PRICE_USD_PER_HOUR: expected a number, got {text!r}") from None
    if not 0 <= value <= 10000:
        raise ConfigError(f"{PREFIX}PRICE_USD_PER_HOUR: must be between 0 and 10000, got {text!r}")
    return value


def _log_level(text: str) -> str:
    level = text.strip().lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{PREFIX}LOG_LEVEL: expected debug, info, warning or error, got {text!r}")
    return level


def _host_id(text: str) -> str:
    value = text.strip()
    if not HOST_ID.fullmatch(value):
        raise ConfigError(
            f"{PREFIX}HOST_ID: {value!r} is not a host id: 1 to 128 letters, digits, '.', '_' and '-', "
            "starting with a letter or a digit"
        )
    return value


def _switch(name: str) -> Callable[[str], bool]:
    def convert(text: str) -> bool:
        value = text.strip().lower()
        if value in ("on", "true", "yes", "1"):
            return True
        if value in ("off", "false", "no", "0"):
            return False
        raise ConfigError(f"{PREFIX}{name}: expected on or off, got {text!r}")

    return convert


def _nonempty(name: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if not text.strip():
            raise ConfigError(f"{PREFIX}{name}: must not be empty")
        return text.strip()

    return convert


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "server_url": _url,
    "token": str.strip,
    "token_file": Path,
    "ca_bundle": Path,
    "interval_s": _positive("INTERVAL_S", 0.0),
    "batch_intervals": _int("BATCH_INTERVALS", 1, 360),
    "state_dir": Path,
    "spool_max_mib": _positive("SPOOL_MAX_MIB"),
    "spool_max_age_h": _positive("SPOOL_MAX_AGE_H"),
    "http_timeout_s": _positive("HTTP_TIMEOUT_S"),
    "backoff_max_s": _positive("BACKOFF_MAX_S"),
    "imds": _imds_mode,
    "imds_url": _nonempty("IMDS_URL"),
    "imds_timeout_s": _positive("IMDS_TIMEOUT_S"),
    "host_id": _host_id,
    "instance_type": _nonempty("INSTANCE_TYPE"),
    "region": _nonempty("REGION"),
    "price_usd_per_hour": _price,
    "tags": _tags,
    "holders": _switch("HOLDERS"),
    "holder_args": _switch("HOLDER_ARGS"),
    "proc_root": Path,
    "pods_root": Path,
    "fake_nvml": _nonempty("FAKE_NVML"),
    "log_level": _log_level,
}
assert set(_CONVERTERS) == {f.name for f in fields(AgentConfig)}


def load_config(
    environ: Mapping[str, str] | None = None,
    *,
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Settings from the env file (if present), the environment, then explicit overrides (command line).

    The file is `config_file`, else `GPUFLEET_AGENT_CONFIG`, else `/etc/gpufleet/agent.env`; a missing default
    file is fine, a missing named file is an error.
    """
    env = dict(os.environ if environ is None else environ)
    named = config_file or (Path(env["GPUFLEET_AGENT_CONFIG"]) if env.get("GPUFLEET_AGENT_CONFIG") else None)
    path = named or DEFAULT_CONFIG_FILE
    raw: dict[str, str] = {}
    try:
        raw.update(parse_env_file(path.read_text(encoding="utf-8"), source=str(path)))
    except FileNotFoundError:
        if named is not None:
            raise ConfigError(f"config file {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"config file {path}: permission denied (run as root or fix its mode)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc})") from None
    if environ is None:
        # Under systemd the whole file is the environment; a shell run (doctor, once) gets its proxies here.
        for name in _PROXY_VARIABLES:
            if name in raw and name not in os.environ:
                os.environ[name] = raw[name]
    raw.update({k: v for k, v in env.items() if k.startswith(PREFIX)})
    known = {PREFIX + name.upper() for name in _CONVERTERS} | {"GPUFLEET_AGENT_CONFIG"}
    unknown = sorted(k for k in raw if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]} (a typo? docs/agent.md lists the settings)")
    if "STATE_DIRECTORY" in env and f"{PREFIX}STATE_DIR" not in raw:
        # systemd's StateDirectory= hands the unit its directory this way.
        raw[f"{PREFIX}STATE_DIR"] = env["STATE_DIRECTORY"].split(":")[0]

    values: dict[str, Any] = {}
    for name, convert in _CONVERTERS.items():
        text = raw.get(PREFIX + name.upper())
        if text is not None and text.strip() != "":
            values[name] = convert(text)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _CONVERTERS[name](value) if isinstance(value, str) else value
    return AgentConfig(**values)
