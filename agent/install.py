"""`gpufleet-agent install`: put the systemd unit and the settings file in place, then enable the unit.

With `root` other than `/` (building an image in a chroot or mounted disk) the files go under `root` and the
unit is enabled by its `multi-user.target.wants` link, as `systemctl enable` would do; systemctl itself is
never run there, since it would talk to the build host's systemd.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from .config import ConfigError, parse_env_file

UNIT_NAME = "gpufleet-agent.service"
# Relative to the install root.
UNIT_FILE = Path("etc/systemd/system") / UNIT_NAME
ENV_FILE = Path("etc/gpufleet/agent.env")
WANTS_LINK = Path("etc/systemd/system/multi-user.target.wants") / UNIT_NAME
PROFILING_DROP_IN = Path("etc/systemd/system") / f"{UNIT_NAME}.d" / "profiling.conf"
PLACEHOLDER = "@EXEC_START@"

# Written unquoted into agent.env, which both systemd and the agent read: keep out what either would
# interpret (quotes, backslash escapes, $ expansion) and anything that could end the line.
_UNSAFE_VALUE_CHARS = set(" \t\"'\\$`")


@dataclass(frozen=True)
class InstallResult:
    actions: list[str]


class InstallError(Exception):
    """Installing cannot go on; the message is one line."""


Systemctl = Callable[[list[str]], int]


def _resource(name: str) -> str:
    return resources.files("agent.packaging").joinpath(name).read_text(encoding="utf-8")


def _quote_exec(path: str) -> str:
    """`path` as the first word of ExecStart=, where % starts a specifier ($ is literal in the program path)."""
    escaped = path.replace("%", "%%")
    return escaped if re.fullmatch(r"[A-Za-z0-9/._+,:@=%-]+", path) else f'"{escaped}"'


def render_unit(exec_path: str) -> str:
    """The systemd unit with `exec_path` (the gpufleet-agent executable) in ExecStart=."""
    if not exec_path.startswith("/"):
        raise InstallError(f"executable path must be absolute, got {exec_path!r}")
    # systemd refuses these in a program path, quoted or not.
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c in "\"'\\" for c in exec_path):
        raise InstallError(f"executable path must not contain quotes, backslashes or control characters: {exec_path!r}")
    template = _resource("gpufleet-agent.service")
    if template.count(PLACEHOLDER) != 1:
        raise InstallError(f"unit template is broken: expected one {PLACEHOLDER}")
    return template.replace(PLACEHOLDER, _quote_exec(exec_path))


def _set_variable(text: str, name: str, value: str) -> str:
    """Uncomment and set `name`'s line in env-file `text`, or append one."""
    line = f"{name}={value}"
    # A string replacement would treat backslashes in the value as escapes.
    text, count = re.subn(rf"^#?{name}=.*$", lambda _m: line, text, count=1, flags=re.M)
    return text if count else text.rstrip("\n") + "\n" + line + "\n"


def render_env(server_url: str | None = None, token: str | None = None) -> str:
    """agent.env: the commented example, with the server URL and token set when given."""
    text = _resource("agent.env.example")
    if server_url is not None:
        text = _set_variable(text, "GPUFLEET_AGENT_SERVER_URL", server_url)
    if token is not None:
        text = _set_variable(text, "GPUFLEET_AGENT_TOKEN", token)
    return text


def _carry_over(env_file: Path, server_url: str | None, token: str | None) -> tuple[str | None, str | None]:
    try:
        old = parse_env_file(env_file.read_text(encoding="utf-8"), source=str(env_file))
    except (OSError, UnicodeDecodeError, ConfigError):
        return server_url, token
    return (
        server_url or old.get("GPUFLEET_AGENT_SERVER_URL") or None,
        token or old.get("GPUFLEET_AGENT_TOKEN") or None,
    )


def _check_value(what: str, value: str) -> None:
    bad = sorted({c for c in value if c in _UNSAFE_VALUE_CHARS or not " " < c <= "~"})
    if bad:
        raise InstallError(f"{what} must not contain {', '.join(repr(c) for c in bad)}")


def _check_server_url(url: str) -> None:
    _check_value("server URL", url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InstallError(f"server URL must look like https://host[:port], got {url!r}")


def _check_token(token: str) -> None:
    if not token:
        raise InstallError("token is empty")
    _check_value("token", token)


def _check_exec(root: Path, exec_path: str, live: bool) -> None:
    if not exec_path.startswith("/"):
        raise InstallError(f"executable path must be absolute, got {exec_path!r}")
    where = "" if live else f" under {root}"
    target = root / exec_path.lstrip("/")
    if not target.is_file():
        raise InstallError(f"executable {exec_path} does not exist{where}")
    if not os.access(target, os.X_OK):
        raise InstallError(f"{exec_path}{where} is not executable")


def _is_live(root: Path) -> bool:
    return os.path.realpath(root) == "/"


def _write(path: Path, text: str, mode: int) -> str:
    """Write atomically with exactly `mode`, whatever the umask; say what happened."""
    try:
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) == mode and path.read_text(encoding="utf-8") == text:
            return f"unchanged {path}"
    except (OSError, UnicodeDecodeError):
        pass
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                os.fchmod(f.fileno(), mode)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc.strerror or exc}") from None
    return f"wrote {path}"


def _enable_offline(root: Path) -> str:
    link = root / WANTS_LINK
    target = "/" + UNIT_FILE.as_posix()
    try:
        if link.is_symlink() and os.readlink(link) == target:
            return f"unchanged {link} (already enabled)"
        link.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except OSError as exc:
        raise InstallError(f"cannot enable the unit: {link}: {exc.strerror or exc}") from None
    return f"enabled {UNIT_NAME}: linked {link} -> {target} (systemctl is not run for a root other than /)"


def _run_systemctl(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, check=False).returncode
    except FileNotFoundError:
        raise InstallError("systemctl not found: this host does not run systemd (use --root for an image)") from None


def activate(systemctl: Systemctl, *, enable: bool = True, start: bool = False) -> list[str]:
    """Make the running systemd load the unit; enable it for boot and (re)start it as asked.

    `systemctl` gets a whole command line (["systemctl", ...]) and returns its exit code.
    """
    commands = [["systemctl", "daemon-reload"]]
    if enable:
        commands.append(["systemctl", "enable", UNIT_NAME])
    if start:
        # restart, not start: a re-install with a new unit or settings must take effect now.
        commands.append(["systemctl", "restart", UNIT_NAME])
    actions = []
    for argv in commands:
        code = systemctl(argv)
        if code != 0:
            raise InstallError(f"`{' '.join(argv)}` failed with exit code {code}")
        actions.append(f"ran {' '.join(argv)}")
    return actions


def install(
    *,
    root: Path = Path("/"),
    exec_path: str,
    server_url: str | None = None,
    token: str | None = None,
    force: bool = False,
    enable: bool = True,
    start: bool = False,
    profiling: bool = False,
    systemctl: Systemctl | None = None,
) -> InstallResult:
    """Install the unit and settings under `root`; on the running system (`root` is /) also tell systemd.

    An existing settings file is kept unless `force`. The state directory is left to systemd's StateDirectory=.
    With `profiling`, a drop-in gives the agent CAP_SYS_ADMIN for GPM; without, an existing one is kept.
    """
    live = _is_live(root)
    if live and os.geteuid() != 0:
        raise InstallError("install needs root: run it with sudo")
    if start and not live:
        raise InstallError(f"cannot start the agent inside {root}: --start needs the root /")
    _check_exec(root, exec_path, live)
    if server_url is not None:
        _check_server_url(server_url)
    if token is not None:
        _check_token(token)
    unit = render_unit(exec_path)

    actions = [_write(root / UNIT_FILE, unit, 0o644)]
    drop_in = root / PROFILING_DROP_IN
    if profiling:
        actions.append(_write(drop_in, _resource("profiling.conf"), 0o644))
    elif drop_in.exists():
        actions.append(f"kept existing {drop_in} (CAP_SYS_ADMIN for GPM; delete it to take that back)")
    env_file = root / ENV_FILE
    if os.path.lexists(env_file) and not force:
        note = ""
        if server_url is not None or token is not None:
            note = "; the given server URL/token were not written (--force replaces the file)"
        try:
            if stat.S_IMODE(env_file.stat().st_mode) & 0o077:
                note += "; it is readable by other users and may hold the token: chmod 600 it"
        except OSError:
            pass
        actions.append(f"kept existing {env_file}{note}")
    else:
        if os.path.lexists(env_file):
            # --force renews the file from the example, but a server URL or token not given again is kept.
            server_url, token = _carry_over(env_file, server_url, token)
        actions.append(_write(env_file, render_env(server_url, token), 0o600))

    if live:
        actions += activate(systemctl or _run_systemctl, enable=enable, start=start)
    elif enable:
        actions.append(_enable_offline(root))
    return InstallResult(actions)
