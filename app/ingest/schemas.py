"""The ingest wire format, schema version 1 (`docs/ingest-protocol.md`).

Unknown fields are ignored, so an agent newer than the server can still deliver; a change that older
servers must not misread gets a new `schema_version`.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ..sources import UTIL_SOURCES

SCHEMA_VERSION = 1

Name = Annotated[str, StringConstraints(min_length=1, max_length=128, strip_whitespace=True)]
Percent = Annotated[float, Field(ge=0, le=100)]
UtilSource = Literal["none", "nvml.samples", "nvml.rate", "nvml.gpm", "dcgm"]
assert set(UtilSource.__args__) == set(UTIL_SOURCES)  # type: ignore[attr-defined]


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class InstanceIn(_In):
    """Who is sending: an EC2 instance (from IMDSv2) or an on-premises host."""

    instance_id: Name = Field(description="EC2 instance id (i-...) or, off EC2, a stable host id.")
    hostname: Annotated[str, StringConstraints(max_length=255)] | None = None
    instance_type: Annotated[str, StringConstraints(max_length=64)] | None = None
    region: Annotated[str, StringConstraints(max_length=32)] | None = None
    availability_zone: Annotated[str, StringConstraints(max_length=32)] | None = None
    lifecycle: Literal["spot", "on-demand", "on-prem"] | None = None
    ami_id: Annotated[str, StringConstraints(max_length=64)] | None = None
    tags: dict[
        Annotated[str, StringConstraints(min_length=1, max_length=128)],
        Annotated[str, StringConstraints(max_length=256)],
    ] = Field(default_factory=dict, max_length=64, description="EC2 instance tags (key: value).")
    price_usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        le=10000,
        description="Price of the whole host set on its agent (GPUFLEET_AGENT_PRICE_USD_PER_HOUR), USD per hour; "
        "usually null on EC2, where the server's catalog prices the instance type.",
    )


class SliceIn(_In):
    """A MIG device: one compute instance inside one GPU instance."""

    uuid: Name = Field(description="MIG device UUID (MIG-...).")
    gpu_instance_id: int = Field(ge=0, le=0xFFFF)
    compute_instance_id: int = Field(ge=0, le=0xFFFF)
    profile: Annotated[str, StringConstraints(min_length=1, max_length=32)] = Field(
        examples=["3g.40gb"], description="MIG profile name; 'unknown' when the agent could not read it."
    )
    compute_slices: int | None = Field(
        default=None,
        ge=1,
        le=7,
        description="Compute slices (of 7) of this compute instance; the whole GPU instance's "
        "unless several compute instances share it. Null when the agent could not read the slice's size: "
        "a live slice of unknown size, never free capacity.",
    )
    memory_total_mib: int | None = Field(default=None, ge=0)
    util_unavailable_reason: Annotated[str, StringConstraints(max_length=500)] | None = None


class PermissionDeniedIn(_In):
    """A figure NVML refused to the agent at its privilege (NO_PERMISSION), and what to grant for it."""

    figure: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="The figure not read, e.g. 'mem_used_mib', 'procs', 'util', 'slice_memory'.",
        examples=["mem_used_mib"],
    )
    call: Annotated[str, StringConstraints(min_length=1, max_length=96)] = Field(
        description="The NVML call that answered NO_PERMISSION.", examples=["nvmlDeviceGetMemoryInfo"]
    )
    grant: Annotated[str, StringConstraints(min_length=1, max_length=32)] = Field(
        description="What to grant the agent: 'mig-monitor', 'cap-sys-admin' or 'device-access'.",
        examples=["mig-monitor"],
    )


class GpuIn(_In):
    """A physical GPU and, in MIG mode, its slices."""

    uuid: Name = Field(description="GPU UUID (GPU-...).")
    index: int = Field(ge=0, le=255)
    name: Name = Field(examples=["NVIDIA A100-SXM4-40GB"])
    memory_total_mib: int | None = Field(default=None, ge=0)
    mig_mode: bool = False
    unpartitioned_slices: int | None = Field(
        default=None, ge=0, le=7, description="MIG compute slices (of 7) that belong to no GPU instance."
    )
    util_unavailable_reason: Annotated[str, StringConstraints(max_length=500)] | None = None
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


class SampleIn(_In):
    """One device over one interval. Absent figures are null, never 0."""

    uuid: Name = Field(description="The GPU or MIG slice this sample is about.")
    util: Percent | None = Field(default=None, description="Mean utilization over the interval, %.")
    util_source: UtilSource = "none"
    sm_active: Percent | None = Field(default=None, description="Mean SM activity, %.")
    mem_used_mib: int | None = Field(default=None, ge=0, le=2**31 - 1)
    power_w: float | None = Field(default=None, ge=0, le=30000, description="Mean power, W.")
    temp_c: float | None = Field(default=None, ge=-100, le=300, description="Temperature, degrees C.")
    procs: int | None = Field(default=None, ge=0, le=32767, description="Compute processes.")
    gr_active: Percent | None = Field(
        default=None, description="Mean graphics-engine activity over the interval, % (NVML GPM, Hopper and newer)."
    )
    sm_clock_mhz: int | None = Field(default=None, ge=0, le=10000, description="SM clock at the interval end, MHz.")
    ecc_uncorrected: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Volatile uncorrected ECC errors since the driver loaded, count."
    )
    procs_mem_mib: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Memory held by the device's compute processes, MiB."
    )

    @model_validator(mode="after")
    def _source_matches(self) -> SampleIn:
        if (self.util is None) != (self.util_source == "none"):
            raise ValueError("util_source must be 'none' exactly when util is null")
        return self


class IntervalIn(_In):
    """One collection interval: every device's sample for it."""

    start: AwareDatetime = Field(description="Interval start, ISO 8601 with an offset (UTC preferred).")
    duration_s: float = Field(gt=0, le=3600, description="Interval length, s.")
    samples: list[SampleIn] = Field(max_length=4096)


class EventIn(_In):
    ts: AwareDatetime
    kind: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9_.]+$")] = Field(
        examples=["spot_interruption"]
    )
    details: dict[str, str | int | float | bool | None] = Field(default_factory=dict, max_length=32)


class AgentIn(_In):
    version: Annotated[str, StringConstraints(max_length=32)] | None = None
    interval_s: float | None = Field(default=None, gt=0, le=3600, description="Collection interval, s.")
    dropped_batches: int = Field(
        default=0, ge=0, description="Batches the agent's spool dropped since its last accepted batch."
    )
    errors: dict[
        Annotated[str, StringConstraints(min_length=1, max_length=96)],
        Annotated[int, Field(ge=0, le=2**31 - 1)],
    ] = Field(
        default_factory=dict,
        max_length=64,
        description="NVML call failures since the agent's previous batch, count per 'call:reason' key "
        "(e.g. 'nvmlDeviceGetPowerUsage:not_supported').",
        examples=[{"nvmlDeviceGetPowerUsage:not_supported": 6}],
    )


class IngestBatchIn(_In):
    """One POST from one agent: who it is, what hardware it has, and samples for one or more intervals."""

    schema_version: Literal[1] = Field(description="Wire format version; this server speaks 1.")
    batch_id: UUID = Field(description="Chosen by the agent; a re-sent batch with the same id is stored once.")
    agent: AgentIn = Field(default_factory=AgentIn)
    instance: InstanceIn
    gpus: list[GpuIn] = Field(max_length=64)
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
