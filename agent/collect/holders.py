"""Who holds a GPU: for each host PID that NVML lists on a GPU or MIG slice, its executable, Unix user, start
time, and the container, Kubernetes pod or Slurm job it runs in, read from /proc.

Standard library only, and cheap once warm: what cannot change while a process lives (executable, user,
cgroups, command line) is kept per (pid, start time). A pid NVML listed in the previous interval too, already
described, is taken to be the same process without reading /proc: for it to be another, the process would
have to exit and the kernel hand its pid to a new one that opens the GPU, all within one interval. Each known
pid's `/proc/<pid>/stat` start time is still checked every `REVALIDATE_S`, so a reused pid is told apart
within that time at the latest. A pid NVML no longer lists is forgotten at the next interval. A process that
exits between NVML's list and these reads is no holder; a file the agent may not read leaves its figure None.
Nothing here raises: reasons are counted in `errors` as "holders:reason".

Pod namespace and name come without a Kubernetes client, from the folders kubelet writes container logs to,
`<pods_root>/<namespace>_<pod-name>_<pod-uid>/` (kubernetes pkg/kubelet/kuberuntime/helpers.go,
`BuildPodLogsDirectory`); namespaces and pod names are DNS names, which hold no '_'.
"""

from __future__ import annotations

import math
import operator
import os
import pwd
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .cgroups import NOTHING, parse_cgroup

# The wire format's bounds (docs/ingest-protocol.md, "Holders"): the agent cuts what is longer.
SAMPLE_HOLDERS = 64
"""Holders one sample lists at most: those holding the most memory."""
REVALIDATE_S = 60.0
"""How often a pid listed interval after interval has its /proc start time checked again, s: a pid reused by
a new process between two intervals is described as the new process within this time."""
NAME_CHARS = 253  # a DNS subdomain's longest, which bounds Kubernetes namespaces and pod names
ID_CHARS = 128
COMMAND_CHARS = 1024
_CONTEXT = (
    ("container_id", ID_CHARS),
    ("pod_uid", ID_CHARS),
    ("namespace", NAME_CHARS),
    ("pod", NAME_CHARS),
    ("job_id", ID_CHARS),
    ("job_step", ID_CHARS),
    ("command", COMMAND_CHARS),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_EARLIEST_S = 946_684_800  # 2000-01-01T00:00:00Z: the server takes no earlier time
_COMMAND_BYTES = COMMAND_CHARS * 4  # UTF-8 takes at most 4 bytes a character
_FILE_BYTES = 1 << 16
_STAT_BYTES = 4096  # a stat line is under 2 KiB; a smaller buffer is a cheaper read
_STARTTIME = 19  # field 22 of stat, counted from field 3, the first after the command name
_O_READ = os.O_RDONLY | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Holder:
    """One process on a GPU or MIG device: host PID, executable name (`comm`, at most 15 characters), real uid
    and its user name, start (epoch s), the device memory NVML says it holds (MiB), and what it runs in.
    None where /proc or the host did not tell; `command` only when the reader was asked for arguments."""

    pid: int
    executable: str | None
    uid: int | None
    user: str | None
    started_at: float | None
    used_mib: int | None
    container_id: str | None = None
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    job_id: str | None = None
    job_step: str | None = None
    command: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The description a batch's `holders` table carries: no memory (each sample says what the holder holds
        there), the start as RFC 3339 UTC in whole seconds, strings one line each and cut to the wire format's
        bounds; what is unknown is left out."""
        wire: dict[str, Any] = {"pid": self.pid}
        if self.executable is not None:
            wire["executable"] = _label(self.executable, NAME_CHARS)
        if self.uid is not None:
            wire["uid"] = self.uid
        if self.user is not None:
            wire["user"] = _label(self.user, NAME_CHARS)
        # A start before 2000 means the host's clock was wrong when it booted; the server would refuse it.
        if self.started_at is not None and self.started_at >= _EARLIEST_S:
            wire["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(self.started_at)))
        for name, limit in _CONTEXT:
            value = getattr(self, name)
            if value is not None:
                wire[name] = _label(value, limit)
        return wire


def _label(text: str, limit: int) -> str:
    """`text` as one line of at most `limit` characters: a process may put any byte but NUL in its name and
    arguments, and control characters are refused on the wire."""
    text = text[:limit]
    return text if text.isprintable() else _CONTROL.sub("\ufffd", text)


def parse_stat(text: str) -> int | None:
    """The start time in clock ticks after boot from a `/proc/<pid>/stat` line; None if malformed."""
    # The command name (field 2) sits in parentheses and may itself hold spaces and ')': the last ')' ends it.
    close = text.rfind(")")
    if close < 0:
        return None
    after = text[close + 1 :].split(None, _STARTTIME + 1)
    if len(after) <= _STARTTIME or not after[_STARTTIME].isdigit():
        return None
    return int(after[_STARTTIME])


def _stat_start(stat: bytes) -> int | None:
    """`parse_stat` of the bytes read, without decoding them: the digits it looks for are ASCII."""
    close = stat.rfind(b")")
    if close < 0:
        return None
    after = stat[close + 1 :].split(None, _STARTTIME + 1)
    if len(after) <= _STARTTIME or not after[_STARTTIME].isdigit():
        return None
    return int(after[_STARTTIME])


def parse_uid(status: str) -> int | None:
    """The real uid from the `Uid:` line of `/proc/<pid>/status` (real, effective, saved, filesystem)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            ids = line.split()
            return int(ids[1]) if len(ids) > 1 and ids[1].isdigit() else None
    return None


def parse_btime(text: str) -> int | None:
    """The boot time in epoch s from the `btime` line of `/proc/stat`."""
    for line in text.splitlines():
        if line.startswith("btime "):
            value = line[6:].strip()
            return int(value) if value.isdigit() else None
    return None


def parse_comm(text: str) -> str | None:
    """The executable name from `/proc/<pid>/comm`."""
    return text.rstrip("\n") or None


def parse_cmdline(data: bytes) -> str | None:
    """A `/proc/<pid>/cmdline` (NUL-separated arguments) as one line, at most `COMMAND_CHARS` characters."""
    line = data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return line[:COMMAND_CHARS] or None


def parse_pod_dirs(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Pod UID -> (namespace, pod name) from the folder names under kubelet's pod log root. Names of other
    forms (older kubelets named the folder by the UID alone) are skipped."""
    pods: dict[str, tuple[str, str]] = {}
    for name in names:
        parts = name.split("_")
        if len(parts) == 3 and all(parts):
            pods[parts[2]] = (parts[0], parts[1])
    return pods


def passwd_name(uid: int) -> str | None:
    """The user name of `uid` in the host's passwd (or whatever NSS serves), None if it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class Vouched:
    """Holders a device listed, their pids, the earliest time one of them is due for a check, and the reader's
    count of changes to what it knows when they were last found to be what it knows (`HolderReader.vouch`)."""

    __slots__ = ("changes", "due", "holders", "pids")

    def __init__(self, holders: tuple[Holder, ...], due: float, changes: int) -> None:
        self.holders = holders
        self.pids = tuple([h.pid for h in holders])
        self.due = due
        self.changes = changes


class _Gone(Exception):
    """The process exited while its files were being read."""


class HolderReader:
    """Reads holders from a proc tree. Call `begin_interval` once at the start of each collection interval,
    then `read` for each (pid, memory) NVML lists; processes not read in an interval are forgotten at the next.
    A pid read in the previous interval is not read from /proc again until `revalidate_s` (on `clock`) has
    passed since its start time was last checked.

    `errors` counts what went wrong as "holders:reason": exited, permission_denied, unreadable (another
    OSError), unparsable, pods_unreadable."""

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        pods_root: Path = Path("/var/log/pods"),
        *,
        with_args: bool = False,
        user_of: Callable[[int], str | None] | None = None,
        revalidate_s: float = REVALIDATE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.pods_root = pods_root
        self.with_args = with_args
        self.revalidate_s = revalidate_s
        self.errors: Counter[str] = Counter()
        self._proc = str(proc_root)
        self._user_of = user_of or passwd_name
        self._clock = clock
        self._now = clock()
        self._users: dict[int, str | None] = {}
        self._hz = os.sysconf("SC_CLK_TCK")
        self._boot: int | None = None
        self._known: dict[int, Holder] = {}  # pid -> the holder as last read
        self._checks: dict[int, tuple[int, float]] = {}  # the same pids -> (start time in ticks, when next checked)
        self._changes = 0  # holders in `_known` replaced or dropped so far
        self._seen: set[int] = set()
        self._pods: dict[str, tuple[str, str]] | None = None

    def begin_interval(self) -> None:
        """Forgets processes not read since the last call and the pod folder listing."""
        for pid in self._known.keys() - self._seen:
            del self._known[pid], self._checks[pid]
            self._changes += 1
        self._seen.clear()
        self._pods = None
        self._now = self._clock()

    def vouch(self, holders: tuple[Holder, ...]) -> Vouched | None:
        """What `keep` needs to pass `holders`, just read, in a later interval; None when it could not: one is not
        the holder last read for its pid, or its pod is not named yet (kubelet may write the pod's folder later)."""
        known, checks = self._known, self._checks
        due = math.inf
        for holder in holders:
            if known.get(holder.pid) is not holder or (holder.pod_uid is not None and holder.pod is None):
                return None
            due = min(due, checks[holder.pid][1])
        return Vouched(holders, due, self._changes)

    def keep(self, vouched: Vouched) -> bool:
        """Whether the holders `vouch` gave, read in the previous interval, are still what `read` would give for
        their pids and memory now, with no start time due for a check; if so they count as read in this interval.
        A check that came since only moves a time later than the one vouched for, so that one still holds."""
        if vouched.due <= self._now:
            return False
        if vouched.changes != self._changes:  # something changed, perhaps not these: look
            if not all(map(operator.is_, map(self._known.get, vouched.pids), vouched.holders)):
                return False
            vouched.changes = self._changes
        self._seen.update(vouched.pids)
        return True

    def read(self, pid: int, used_mib: int | None) -> Holder | None:
        """The holder behind host `pid`, or None if it has exited."""
        self._seen.add(pid)
        known = self._known.get(pid)
        checked = self._checks.get(pid)
        if known is not None and checked is not None and checked[1] > self._now:
            # Listed in the previous interval and checked lately: the same process (see the module's description).
            holder = known
            if holder.used_mib == used_mib and (holder.pod_uid is None or holder.pod is not None):
                return holder
            if holder.pod_uid is not None and holder.pod is None:
                holder = self._named(holder)  # kubelet may have written the folder since
            if holder.used_mib != used_mib:
                holder = replace(holder, used_mib=used_mib)
            if holder is not known:
                self._known[pid] = holder
                self._changes += 1
            return holder
        base = f"{self._proc}/{pid}/"
        try:
            stat = self._read_stat(base + "stat")
            start = _stat_start(stat) if stat is not None else None
            if stat is not None and start is None:
                self.errors["holders:unparsable"] += 1
            if known is not None and checked is not None and start is not None and checked[0] == start:
                holder = known
                if holder.pod_uid is not None and holder.pod is None:
                    holder = self._named(holder)
            else:
                holder = self._fresh(pid, base, start)
        except _Gone:
            self._forget(pid)
            self.errors["holders:exited"] += 1
            return None
        if holder.used_mib != used_mib:
            holder = replace(holder, used_mib=used_mib)
        if start is None:
            self._forget(pid)  # an unknown start cannot tell a reused pid: read afresh each interval
        else:
            if known is not None and holder is not known:
                self._changes += 1
            self._known[pid] = holder
            self._checks[pid] = (start, self._now + self.revalidate_s)
        return holder

    def _forget(self, pid: int) -> None:
        if self._known.pop(pid, None) is not None:
            self._changes += 1
        self._checks.pop(pid, None)

    def _fresh(self, pid: int, base: str, start: int | None) -> Holder:
        comm = self._read(base + "comm")
        status = self._read(base + "status")
        cgroup = self._read(base + "cgroup")
        cmdline = self._read(base + "cmdline", _COMMAND_BYTES) if self.with_args else None
        uid = None
        if status is not None:
            uid = parse_uid(status.decode("utf-8", "replace"))
            if uid is None:
                self.errors["holders:unparsable"] += 1
        ids = parse_cgroup(cgroup.decode("utf-8", "replace")) if cgroup is not None else NOTHING
        holder = Holder(
            pid,
            executable=parse_comm(comm.decode("utf-8", "replace")) if comm is not None else None,
            uid=uid,
            user=self._user(uid),
            started_at=self._started_at(start),
            used_mib=None,
            container_id=ids.container_id,
            pod_uid=ids.pod_uid,
            job_id=ids.job_id,
            job_step=ids.job_step,
            command=parse_cmdline(cmdline) if cmdline is not None else None,
        )
        return self._named(holder) if holder.pod_uid is not None else holder

    def _read_stat(self, path: str) -> bytes | None:
        """`_read` of a stat file in the one read it takes: the call made for every holder every interval."""
        try:
            fd = os.open(path, _O_READ)
        except (FileNotFoundError, ProcessLookupError):
            raise _Gone from None
        except OSError:
            return self._read(path, _STAT_BYTES, one_read=True)  # counts why
        try:
            return os.read(fd, _STAT_BYTES)
        except ProcessLookupError:
            raise _Gone from None
        except OSError:
            return self._read(path, _STAT_BYTES, one_read=True)
        finally:
            os.close(fd)

    def _read(self, path: str, limit: int = _FILE_BYTES, *, one_read: bool = False) -> bytes | None:
        """A /proc file's bytes (at most `limit`), None if unreadable; `_Gone` if the process has exited. With
        `one_read`, a single read: procfs hands over a file shorter than the buffer whole (seq_file), which
        saves the read that would find its end."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                chunks: list[bytes] = []
                size = 0
                while size < limit:
                    chunk = os.read(fd, limit - size)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if one_read:
                        break
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            raise _Gone from None
        except PermissionError:
            self.errors["holders:permission_denied"] += 1
            return None
        except OSError:
            self.errors["holders:unreadable"] += 1
            return None
        return b"".join(chunks)

    def _user(self, uid: int | None) -> str | None:
        if uid is None:
            return None
        if uid not in self._users:
            self._users[uid] = self._user_of(uid)
        return self._users[uid]

    def _started_at(self, start: int | None) -> float | None:
        if start is None:
            return None
        if self._boot is None:
            try:
                text = self._read(f"{self._proc}/stat")
            except _Gone:
                text = None
                self.errors["holders:unreadable"] += 1
            if text is None:
                return None
            self._boot = parse_btime(text.decode("ascii", "replace"))
            if self._boot is None:
                self.errors["holders:unparsable"] += 1
                return None
        return self._boot + start / self._hz

    def _named(self, holder: Holder) -> Holder:
        """`holder` with its pod's namespace and name, where kubelet's log folders name them."""
        if self._pods is None:
            try:
                self._pods = parse_pod_dirs(os.listdir(self.pods_root))
            except FileNotFoundError:
                self._pods = {}
            except OSError:
                self.errors["holders:pods_unreadable"] += 1
                self._pods = {}
        assert holder.pod_uid is not None
        found = self._pods.get(holder.pod_uid)
        return holder if found is None else replace(holder, namespace=found[0], pod=found[1])
