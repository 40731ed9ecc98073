from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

import agent.install as install_mod
from agent.config import _CONVERTERS, AgentConfig, ConfigError, load_config, parse_env_file
from agent.install import InstallError, activate, install, render_env, render_unit

EXEC = "/opt/gpufleet-agent/bin/gpufleet-agent"
UNIT = Path("etc/systemd/system/gpufleet-agent.service")
ENV = Path("etc/gpufleet/agent.env")
WANTS = Path("etc/systemd/system/multi-user.target.wants/gpufleet-agent.service")


class Recorder:
    def __init__(self, code: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.code = code

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        return self.code


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """An image root with the agent installed at EXEC."""
    root = tmp_path / "image"
    _executable(root / EXEC.lstrip("/"))
    return root


@pytest.fixture
def no_umask() -> Iterator[None]:
    """Modes must come out right whatever the umask; 0 would leave them wide open if install relied on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _example() -> str:
    return resources.files("agent.packaging").joinpath("agent.env.example").read_text(encoding="utf-8")


# --- the unit ----------------------------------------------------------------------------------------


def test_render_unit_fills_the_executable() -> None:
    unit = render_unit(EXEC)
    assert f"\nExecStart={EXEC} run\n" in unit
    assert "@EXEC_START@" not in unit


def test_render_unit_quotes_odd_paths() -> None:
    unit = render_unit("/opt/my agent/100%/$HOME/gpufleet-agent")
    assert '\nExecStart="/opt/my agent/100%%/$HOME/gpufleet-agent" run\n' in unit


@pytest.mark.parametrize(
    "path", ["gpufleet-agent", "bin/gpufleet-agent", "/opt/x\nExecStartPre=/bin/true", '/opt/"x"/a', "/opt/x\\y"]
)
def test_render_unit_refuses_paths_systemd_cannot_run(path: str) -> None:
    with pytest.raises(InstallError):
        render_unit(path)


@pytest.mark.parametrize("dirname", ["bin", "odd dir %n $USER"])
def test_unit_passes_systemd_analyze_verify(tmp_path: Path, dirname: str) -> None:
    analyze = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not Path(analyze).exists():
        pytest.fail("systemd-analyze not found: install Debian's `systemd` package (apt-get install systemd)")
    # verify checks that ExecStart's program exists, which also proves the path was quoted right.
    exe = _executable(tmp_path / dirname / "gpufleet-agent")
    unit = tmp_path / "gpufleet-agent.service"
    unit.write_text(render_unit(str(exe)))
    # debug level would list harmless lines about our unit (e.g. syscalls this libseccomp does not know).
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice", "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""}
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    # Other units on this machine may draw warnings of their own; only ours count.
    ours = [line for line in output.splitlines() if unit.name in line or str(tmp_path) in line]
    assert done.returncode == 0 and not ours, output


def test_unit_keeps_the_essential_settings() -> None:
    unit = render_unit(EXEC)
    for line in [
        "Restart=always",
        "StartLimitIntervalSec=0",
        "EnvironmentFile=-/etc/gpufleet/agent.env",
        "StateDirectory=gpufleet-agent",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-caps rwm",
        "ExecStartPre=-+/usr/bin/nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/monitor",
        "CapabilityBoundingSet=",
        "WantedBy=multi-user.target",
    ]:
        assert f"\n{line}\n" in unit, line
    assert "\nPrivateDevices=" not in unit and "\nDynamicUser=" not in unit


# --- the settings example ----------------------------------------------------------------------------


def test_env_example_lists_every_setting_and_nothing_else() -> None:
    documented = set(re.findall(r"^#(GPUFLEET_AGENT_[A-Z0-9_]+)=", _example(), flags=re.M))
    assert documented == {f"GPUFLEET_AGENT_{name.upper()}" for name in _CONVERTERS}


def test_env_example_parses_and_shows_the_defaults(tmp_path: Path) -> None:
    text = _example()
    assert parse_env_file(text) == {}, "every setting in the example is commented out"
    uncommented = tmp_path / "agent.env"
    uncommented.write_text(re.sub(r"^#(GPUFLEET_AGENT_)", r"\1", text, flags=re.M))
    assert len(parse_env_file(uncommented.read_text())) == len(_CONVERTERS)
    assert load_config({}, config_file=uncommented) == AgentConfig()


def test_render_env_sets_url_and_token(tmp_path: Path) -> None:
    path = tmp_path / "agent.env"
    path.write_text(render_env("https://fleet.example.com", "gpf_abc-123"))
    values = parse_env_file(path.read_text())
    assert values == {"GPUFLEET_AGENT_SERVER_URL": "https://fleet.example.com", "GPUFLEET_AGENT_TOKEN": "gpf_abc-123"}
    config = load_config({}, config_file=path)
    assert config.ingest_url == "https://fleet.example.com/api/v1/ingest"
    assert config.bearer_token() == "gpf_abc-123"


# --- install into an image ---------------------------------------------------------------------------


@pytest.mark.usefixtures("no_umask")
def test_install_into_image_writes_both_files_and_enables(image: Path) -> None:
    systemctl = Recorder()
    result = install(root=image, exec_path=EXEC, server_url="http://10.0.0.5:8000", token="gpf_x", systemctl=systemctl)

    assert _mode(image / UNIT) == 0o644
    assert f"ExecStart={EXEC} run" in (image / UNIT).read_text()
    assert _mode(image / ENV) == 0o600
    values = parse_env_file((image / ENV).read_text())
    assert values["GPUFLEET_AGENT_SERVER_URL"] == "http://10.0.0.5:8000"
    assert values["GPUFLEET_AGENT_TOKEN"] == "gpf_x"
    assert os.readlink(image / WANTS) == "/etc/systemd/system/gpufleet-agent.service"
    assert systemctl.calls == []
    assert not (image / "var").exists(), "the state directory is systemd's job"
    assert f"wrote {image / UNIT}" in result.actions
    assert f"wrote {image / ENV}" in result.actions
    assert not list(image.rglob(".*")), "no temporary files left behind"


@pytest.mark.usefixtures("no_umask")
def test_profiling_adds_cap_sys_admin_in_a_drop_in_and_a_plain_install_keeps_it(image: Path) -> None:
    drop_in = image / "etc/systemd/system/gpufleet-agent.service.d/profiling.conf"
    install(root=image, exec_path=EXEC, enable=False)
    assert not drop_in.exists(), "least privilege unless asked"
    result = install(root=image, exec_path=EXEC, enable=False, profiling=True)
    assert f"wrote {drop_in}" in result.actions and _mode(drop_in) == 0o644
    assert "\n[Service]\nCapabilityBoundingSet=CAP_SYS_ADMIN\n" in drop_in.read_text()
    again = install(root=image, exec_path=EXEC, enable=False)
    assert any(a.startswith(f"kept existing {drop_in}") for a in again.actions)


def test_install_without_url_or_token_writes_the_commented_example(image: Path) -> None:
    install(root=image, exec_path=EXEC, enable=False)
    assert (image / ENV).read_text() == _example()
    assert not os.path.lexists(image / WANTS)


def test_install_keeps_an_existing_env_file_unless_forced(image: Path) -> None:
    (image / ENV).parent.mkdir(parents=True)
    (image / ENV).write_text("GPUFLEET_AGENT_SERVER_URL=https://old.example.com\n")
    (image / ENV).chmod(0o644)

    result = install(root=image, exec_path=EXEC, server_url="https://new.example.com", token="gpf_new")
    assert (image / ENV).read_text() == "GPUFLEET_AGENT_SERVER_URL=https://old.example.com\n"
    [kept] = [line for line in result.actions if line.startswith("kept existing")]
    assert str(image / ENV) in kept and "--force" in kept and "chmod 600" in kept

    install(root=image, exec_path=EXEC, server_url="https://new.example.com", token="gpf_new", force=True)
    assert parse_env_file((image / ENV).read_text())["GPUFLEET_AGENT_SERVER_URL"] == "https://new.example.com"
    assert _mode(image / ENV) == 0o600


def test_force_keeps_a_token_it_was_not_given_again(image: Path) -> None:
    install(root=image, exec_path=EXEC, server_url="https://old.example.com", token="gpf_keep")
    install(root=image, exec_path=EXEC, server_url="https://new.example.com", force=True)
    values = parse_env_file((image / ENV).read_text())
    assert values == {"GPUFLEET_AGENT_SERVER_URL": "https://new.example.com", "GPUFLEET_AGENT_TOKEN": "gpf_keep"}


def test_install_twice_changes_nothing(image: Path) -> None:
    install(root=image, exec_path=EXEC)
    again = install(root=image, exec_path=EXEC)
    assert again.actions[0] == f"unchanged {image / UNIT}"
    assert again.actions[1].startswith(f"kept existing {image / ENV}")
    assert again.actions[2].startswith(f"unchanged {image / WANTS}")


def test_install_never_starts_inside_an_image(image: Path) -> None:
    systemctl = Recorder()
    with pytest.raises(InstallError, match="--start"):
        install(root=image, exec_path=EXEC, start=True, systemctl=systemctl)
    assert systemctl.calls == []
    assert not (image / "etc").exists()


@pytest.mark.parametrize(
    ("exec_path", "message"),
    [
        ("opt/gpufleet-agent/bin/gpufleet-agent", "absolute"),
        ("/opt/gpufleet-agent/bin/missing", "does not exist"),
        ("/opt/gpufleet-agent/bin", "does not exist"),
        ("/opt/gpufleet-agent/bin/not-executable", "not executable"),
    ],
)
def test_install_refuses_bad_executables(image: Path, exec_path: str, message: str) -> None:
    (image / "opt/gpufleet-agent/bin/not-executable").write_text("")
    with pytest.raises(InstallError, match=message):
        install(root=image, exec_path=exec_path)
    assert not (image / "etc").exists()


@pytest.mark.parametrize(
    ("server_url", "token"),
    [
        ("fleet.example.com", None),
        ("ftp://fleet.example.com", None),
        ("https://", None),
        ("https://fleet.example.com/a b", None),
        (None, ""),
        (None, "gpf_abc def"),
        (None, "gpf_abc\nGPUFLEET_AGENT_SERVER_URL=https://evil.example.com"),
        (None, "gpf_abc\t"),
        (None, '"gpf_abc"'),
        (None, "gpf_$abc"),
    ],
)
def test_install_refuses_bad_url_or_token(image: Path, server_url: str | None, token: str | None) -> None:
    with pytest.raises(InstallError) as raised:
        install(root=image, exec_path=EXEC, server_url=server_url, token=token)
    assert "\n" not in str(raised.value)
    assert not (image / "etc").exists()


# --- install on the running system -------------------------------------------------------------------


def test_install_on_the_running_system_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    systemctl = Recorder()
    with pytest.raises(InstallError, match="install needs root: run it with sudo"):
        install(root=Path("/"), exec_path=EXEC, systemctl=systemctl)
    assert systemctl.calls == []


@pytest.mark.parametrize(
    ("enable", "start", "expected"),
    [
        (True, False, [["daemon-reload"], ["enable", "gpufleet-agent.service"]]),
        (True, True, [["daemon-reload"], ["enable", "gpufleet-agent.service"], ["restart", "gpufleet-agent.service"]]),
        (False, True, [["daemon-reload"], ["restart", "gpufleet-agent.service"]]),
        (False, False, [["daemon-reload"]]),
    ],
)
def test_activate_runs_systemctl(enable: bool, start: bool, expected: list[list[str]]) -> None:
    systemctl = Recorder()
    actions = activate(systemctl, enable=enable, start=start)
    assert systemctl.calls == [["systemctl", *args] for args in expected]
    assert actions == [f"ran systemctl {' '.join(args)}" for args in expected]


def test_activate_stops_at_the_first_failure() -> None:
    systemctl = Recorder(code=1)
    with pytest.raises(InstallError, match=r"systemctl daemon-reload.*exit code 1"):
        activate(systemctl, start=True)
    assert len(systemctl.calls) == 1


def test_install_on_the_running_system_tells_systemd(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand the image in for / so nothing real is written.
    monkeypatch.setattr(install_mod, "_is_live", lambda root: root == image)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    systemctl = Recorder()
    result = install(root=image, exec_path=EXEC, token="gpf_x", start=True, systemctl=systemctl)
    assert systemctl.calls == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "gpufleet-agent.service"],
        ["systemctl", "restart", "gpufleet-agent.service"],
    ]
    assert result.actions[-1] == "ran systemctl restart gpufleet-agent.service"
    assert not os.path.lexists(image / WANTS), "systemctl enable makes the link on a running system"


def test_missing_systemctl_is_an_install_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InstallError, match="systemctl not found"):
        activate(install_mod._run_systemctl)


def test_examples_ship_as_package_data() -> None:
    files = resources.files("agent.packaging")
    assert files.joinpath("cloud-init.yaml").read_text(encoding="utf-8").startswith("#cloud-config\n")
    assert "CapabilityBoundingSet=CAP_SYS_ADMIN" in files.joinpath("profiling.conf").read_text(encoding="utf-8")
    hcl = files.joinpath("packer.pkr.hcl").read_text(encoding="utf-8")
    assert 'gpufleet-agent install"' in hcl and "--start" not in hcl


@pytest.mark.parametrize("bad", ["rack 7", "gpu/7", "-node", "x" * 129])
def test_a_host_id_the_server_would_refuse_is_a_config_error(bad: str, tmp_path: Path) -> None:
    empty = tmp_path / "agent.env"
    empty.write_text("")
    with pytest.raises(ConfigError, match="HOST_ID"):
        load_config({"GPUFLEET_AGENT_HOST_ID": bad}, config_file=empty)
