"""The ingest wire format, schema version 1 (`docs/ingest-protocol.md`).

Unknown fields are ignored, so an agent newer than the server can still deliver; a change that older
servers must not misread gets a new `schema_version`. The ingest route validates the JSON body in strict
mode (`parse.parse_batch`): a field takes the JSON type the OpenAPI schema gives it and no other (no `false`
for 0, no number for a time). The field types themselves are in `fields.py`.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ..sources import UTIL_SOURCES
from .fields import (
    DETAIL_KEYS,
    WHOLE,
    DetailKey,
    DetailValue,
    DeviceUuid,
    EventKind,
    InstanceId,
    Name,
    Timestamp,
    key_patterns_as_property_names,
    label,
    not_bool,
    text,
    uuid_form,
)

SCHEMA_VERSION = 1
INT4_MAX = 2**31 - 1
"""Largest value of a PostgreSQL `integer` column."""
MAX_HOLDERS = 4096
"""Holders described in one batch at most; also one more than the largest holder `id`."""
SAMPLE_HOLDERS = 64
"""Holders one sample refers to at most."""
PID_MAX = 2**22
"""Linux's largest `pid_max`."""
UID_MAX = 2**32 - 2
"""Largest Unix user id: 2^32 - 1 is (uid_t) -1, "no user"."""

Percent = Annotated[float, Field(ge=0, le=100)]
# Bounds go before WHOLE, which wraps them (fields.py).
MiB = Annotated[int, Field(ge=0, le=INT4_MAX), WHOLE]
UtilSource = Literal["none", "nvml.samples", "nvml.rate", "nvml.gpm", "dcgm"]
assert set(UtilSource.__args__) == set(UTIL_SOURCES)  # type: ignore[attr-defined]


class _In(BaseModel):
    model_config = ConfigDict(
        extra="ignore", frozen=True, allow_inf_nan=False, json_schema_extra=key_patterns_as_property_names
    )


class InstanceIn(_In):
    """Who is sending: an EC2 instance (from IMDSv2) or an on-premises host."""

    instance_id: InstanceId = Field(
        description="EC2 instance id (i- and 8 or 17 hex digits) or, off EC2, a stable host id of letters, digits, "
        "'.', '_' and '-' that starts with a letter or a digit. It names the instance's page (/instances/<id>)."
    )
    hostname: Annotated[str, label(255)] | None = None
    instance_type: Annotated[str, label(64)] | None = None
    region: Annotated[str, label(32)] | None = None
    availability_zone: Annotated[str, label(32)] | None = None
    lifecycle: Literal["spot", "on-demand", "on-prem"] | None = None
    ami_id: Annotated[str, label(64)] | None = None
    tags: dict[Annotated[str, label(128, min_length=1)], Annotated[str, label(256)]] = Field(
        default_factory=dict, max_length=64, description="EC2 instance tags (key: value)."
    )
    price_usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        le=10000,
        description="Price of the whole host set on its agent (GPUFLEET_AGENT_PRICE_USD_PER_HOUR), USD per hour; "
        "usually null on EC2, where the server's catalog prices the instance type.",
    )


class SliceIn(_In):
    """A MIG device: one compute instance inside one GPU instance."""

    uuid: DeviceUuid = Field(description="MIG device UUID (MIG-...).")
    gpu_instance_id: Annotated[int, Field(ge=0, le=0xFFFF), WHOLE]
    compute_instance_id: Annotated[int, Field(ge=0, le=0xFFFF), WHOLE]
    profile: Annotated[str, label(32, min_length=1)] = Field(
        examples=["3g.40gb"], description="MIG profile name; 'unknown' when the agent could not read it."
    )
    compute_slices: Annotated[int, Field(ge=1, le=7), WHOLE] | None = Field(
        default=None,
        description="Compute slices (of 7) of this compute instance; the whole GPU instance's "
        "unless several compute instances share it. Null when the agent could not read the slice's size: "
        "a live slice of unknown size, never free capacity.",
    )
    memory_total_mib: MiB | None = None
    util_unavailable_reason: Annotated[str, text(500)] | None = None


class PermissionDeniedIn(_In):
    """A figure NVML refused to the agent at its privilege (NO_PERMISSION), and what to grant for it."""

    figure: Annotated[str, label(64, min_length=1)] = Field(
        description="The figure not read, e.g. 'mem_used_mib', 'procs', 'util', 'slice_memory'.",
        examples=["mem_used_mib"],
    )
    call: Annotated[str, label(96, min_length=1)] = Field(
        description="The NVML call that answered NO_PERMISSION.", examples=["nvmlDeviceGetMemoryInfo"]
    )
    grant: Annotated[str, label(32, min_length=1)] = Field(
        description="What to grant the agent: 'mig-monitor', 'cap-sys-admin' or 'device-access'.",
        examples=["mig-monitor"],
    )


class GpuIn(_In):
    """A physical GPU and, in MIG mode, its slices."""

    uuid: DeviceUuid = Field(description="GPU UUID (GPU-...).")
    index: Annotated[int, Field(ge=0, le=255), WHOLE]
    name: Name = Field(examples=["NVIDIA A100-SXM4-40GB"])
    memory_total_mib: MiB | None = None
    mig_mode: bool = False
    unpartitioned_slices: Annotated[int, Field(ge=0, le=7), WHOLE] | None = Field(
        default=None, description="MIG compute slices (of 7) that belong to no GPU instance."
    )
    util_unavailable_reason: Annotated[str, text(500)] | None = None
    slices: list[SliceIn] = Field(default_factory=list, max_length=7 * 8)
    layout_complete: bool = Field(
        default=True,
        description="False when, in MIG mode, the agent found a MIG device whose size it could not read (or "
        "could not identify): the GPU's free MIG capacity is then unknown.",
    )
    permission_denied: list[PermissionDeniedIn] = Field(
        default_factory=list,
        max_length=32,
        description="Figures of this GPU or its slices that NVML refused at the agent's privilege.",
    )


class HolderIn(_In):
    """A process that holds a device, as the agent's host sees it in /proc (docs/ingest-protocol.md, "Holders").
    Described once per batch; samples refer to it by `id`. A field the agent could not read is left out."""

    id: Annotated[int, Field(ge=0, le=MAX_HOLDERS - 1), WHOLE] = Field(
        description="The holder's number in this batch; unique within it, meaningless outside it."
    )
    pid: Annotated[int, Field(ge=1, le=PID_MAX), WHOLE] = Field(description="The host's process id.")
    executable: Annotated[str, label(253, min_length=1)] | None = Field(
        default=None, description="The executable's name as the kernel keeps it (/proc/<pid>/comm)."
    )
    uid: Annotated[int, Field(ge=0, le=UID_MAX), WHOLE] | None = Field(
        default=None, description="The process's real Unix user id."
    )
    user: Annotated[str, label(253, min_length=1)] | None = Field(default=None, description="The host's name for uid.")
    started_at: Timestamp | None = Field(
        default=None, description="When the process started: RFC 3339, with seconds and an offset (UTC preferred)."
    )
    container_id: Annotated[str, label(128, min_length=1)] | None = Field(
        default=None, description="The container the process runs in, from its cgroup."
    )
    pod_uid: Annotated[str, label(128, min_length=1)] | None = Field(
        default=None, description="The Kubernetes pod's UID, from the process's cgroup."
    )
    namespace: Annotated[str, label(253, min_length=1)] | None = Field(
        default=None, description="The Kubernetes pod's namespace."
    )
    pod: Annotated[str, label(253, min_length=1)] | None = Field(default=None, description="The Kubernetes pod's name.")
    job_id: Annotated[str, label(128, min_length=1)] | None = Field(
        default=None, description="The Slurm job id, from the process's cgroup."
    )
    job_step: Annotated[str, label(128, min_length=1)] | None = Field(
        default=None, description="The Slurm step: a number, 'batch', 'extern' or 'interactive'."
    )
    command: Annotated[str, label(1024, min_length=1)] | None = Field(
        default=None, description="The command line, its arguments separated by spaces."
    )


class HolderRefIn(_In):
    """A sample's reference to one of its batch's holders, with the memory that process holds on the device."""

    ref: Annotated[int, Field(ge=0, le=MAX_HOLDERS - 1), WHOLE] = Field(
        description="The `id` of a holder in this batch's `holders`."
    )
    used_mib: MiB | None = Field(
        default=None, description="Device memory the process holds on this device, MiB; null when the driver hides it."
    )


class SampleIn(_In):
    """One device over one interval. Absent figures are null, never 0."""

    uuid: DeviceUuid = Field(description="The GPU or MIG slice this sample is about.")
    util: Percent | None = Field(default=None, description="Mean utilization over the interval, %.")
    util_source: UtilSource = "none"
    sm_active: Percent | None = Field(default=None, description="Mean SM activity, %.")
    mem_used_mib: MiB | None = None
    power_w: float | None = Field(default=None, ge=0, le=30000, description="Mean power, W.")
    temp_c: float | None = Field(default=None, ge=-100, le=300, description="Temperature, degrees C.")
    procs: Annotated[int, Field(ge=0, le=32767), WHOLE] | None = Field(default=None, description="Compute processes.")
    gr_active: Percent | None = Field(
        default=None, description="Mean graphics-engine activity over the interval, % (NVML GPM, Hopper and newer)."
    )
    sm_clock_mhz: Annotated[int, Field(ge=0, le=10000), WHOLE] | None = Field(
        default=None, description="SM clock at the interval end, MHz."
    )
    ecc_uncorrected: Annotated[int, Field(ge=0, le=INT4_MAX), WHOLE] | None = Field(
        default=None, description="Volatile uncorrected ECC errors since the driver loaded, count."
    )
    procs_mem_mib: MiB | None = Field(default=None, description="Memory held by the device's compute processes, MiB.")
    holders: list[HolderRefIn] = Field(
        default_factory=list,
        max_length=SAMPLE_HOLDERS,
        description="The device's processes, as references into the batch's `holders`; each at most once.",
    )

    @model_validator(mode="after")
    def _source_matches(self) -> SampleIn:
        if (self.util is None) != (self.util_source == "none"):
            raise ValueError("util_source must be 'none' exactly when util is null")
        return self


class IntervalIn(_In):
    """One collection interval: every device's sample for it."""

    start: Timestamp = Field(
        description="Interval start: RFC 3339, with seconds and an offset (UTC preferred); from 2000 on, and within "
        "the server's time range (docs/ingest-protocol.md)."
    )
    duration_s: float = Field(gt=0, le=3600, description="Interval length, s.")
    samples: list[SampleIn] = Field(max_length=4096)


class EventIn(_In):
    """Something the agent noticed. `details` is small by design: the agent's largest is a 500-character excerpt."""

    ts: Timestamp = Field(
        description="When it happened: RFC 3339, with seconds and an offset; from 2000 on, and at most "
        "GPUFLEET_MAX_FUTURE_SKEW_S ahead of the server clock."
    )
    kind: EventKind = Field(examples=["spot_interruption"])
    details: dict[DetailKey, DetailValue] = Field(default_factory=dict, max_length=DETAIL_KEYS)


class AgentIn(_In):
    version: Annotated[str, label(32)] | None = None
    interval_s: float | None = Field(default=None, gt=0, le=3600, description="Collection interval, s.")
    dropped_batches: Annotated[int, Field(ge=0, le=INT4_MAX), WHOLE] = Field(
        default=0, description="Batches the agent's spool dropped since its last accepted batch."
    )
    errors: dict[
        Annotated[str, label(96, min_length=1)],
        Annotated[int, Field(ge=0, le=INT4_MAX), WHOLE],
    ] = Field(
        default_factory=dict,
        max_length=64,
        description="NVML call failures since the agent's previous batch, count per 'call:reason' key "
        "(e.g. 'nvmlDeviceGetPowerUsage:not_supported').",
        examples=[{"nvmlDeviceGetPowerUsage:not_supported": 6}],
    )


class IngestBatchIn(_In):
    """One POST from one agent: who it is, what hardware it has, and samples for one or more intervals."""

    schema_version: Annotated[Literal[1], BeforeValidator(not_bool), WHOLE] = Field(
        description="Wire format version; this server speaks 1."
    )
    batch_id: Annotated[UUID, BeforeValidator(uuid_form)] = Field(
        description="Chosen by the agent; a re-sent batch with the same id is stored once."
    )
    agent: AgentIn = Field(default_factory=AgentIn)
    instance: InstanceIn
    gpus: list[GpuIn] = Field(max_length=64)
    holders: list[HolderIn] = Field(
        default_factory=list,
        max_length=MAX_HOLDERS,
        description="The processes the samples refer to, each described once; ids unique within the batch.",
    )
    intervals: list[IntervalIn] = Field(max_length=1000)
    events: list[EventIn] = Field(default_factory=list, max_length=100)


class IngestResult(BaseModel):
    status: Literal["stored", "duplicate"]
    batch_id: UUID
    samples: int = Field(description="Samples stored by this call (0 for a duplicate).")


class ErrorItem(BaseModel):
    field: str
    message: str


class ErrorOut(BaseModel):
    error: str
    detail: list[ErrorItem] = Field(default_factory=list)
