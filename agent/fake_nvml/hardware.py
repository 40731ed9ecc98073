"""What the simulated hardware is: GPU models with their MIG profiles, driver branches, and the caller's privilege.

Every figure here comes from NVIDIA's documentation or published output of real hosts; the source is named
next to it. Where sources disagree (MIG sizes move a little between driver branches), the newer one is used
and the other is noted, since the agent must name profiles from either.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Profile:
    """A MIG GPU-instance profile as NVML's device attributes describe it (memory in MiB)."""

    slices: int
    memory_mb: int
    sms: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    total_mib: int
    reserved_mib: int
    arch: int
    tdp_w: float
    idle_w: float
    sm_idle_mhz: int
    sm_boost_mhz: int
    mem_mhz: int
    video_mhz: int
    temp_idle_c: float
    temp_busy_c: float
    pci_device_id: int
    gpm: str  # "yes": Hopper GPM; "no": isSupportedDevice 0; "error": the support query raises NotSupported
    profiles: dict[str, Profile] = field(default_factory=dict)

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)


# A100-SXM4-40GB (p4d). Sizes as current drivers report them: 1g.5gb 4864 MiB and 3g.20gb 20096 MiB in
# HTCondor's condor_gpu_discovery man page, 4.75/9.75/19.62/39.50 GiB in `nvidia-smi mig -lgip` copies from
# recent drivers; the MIG user guide's older table has 9.62/19.50/39.25 GiB (9856/19968/40192 MiB). SMs and
# engines: the MIG user guide's -lgip table (14/28/42/56/98 SMs; 0/1/2/2/5 decoders).
A100_40GB = Model(
    "NVIDIA A100-SXM4-40GB", 40960, 438, 7, 400.0, 52.0, 210, 1410, 1215, 1155, 31.0, 67.0, 0x20B010DE, "no",
    {
        "1g.5gb": Profile(1, 4864, 14, 1, 0, 0, 0),
        "1g.10gb": Profile(1, 9984, 14, 1, 1, 0, 0),
        "2g.10gb": Profile(2, 9984, 28, 2, 1, 0, 0),
        "3g.20gb": Profile(3, 20096, 42, 3, 2, 0, 0),
        "4g.20gb": Profile(4, 20096, 56, 4, 2, 0, 0),
        "7g.40gb": Profile(7, 40448, 98, 7, 5, 1, 1),
    },
)  # fmt: skip

# A100-SXM4-80GB (p4de): 81920 MiB total in nvidia-smi captures (NVIDIA/go-nvml#57). -lgip copies: 1g.10gb
# 9.50, 1g.20gb/2g.20gb 19.50, 3g.40gb/4g.40gb 39.25, 7g.80gb 79.00 GiB; a real 2g.20gb device at 19968 MiB
# (XuehaiPan/nvitop#8). Not confirmed from a full capture.
A100_80GB = Model(
    "NVIDIA A100-SXM4-80GB", 81920, 547, 7, 400.0, 60.0, 210, 1410, 1593, 1155, 32.0, 68.0, 0x20B210DE, "no",
    {
        "1g.10gb": Profile(1, 9728, 14, 1, 0, 0, 0),
        "1g.20gb": Profile(1, 19968, 14, 1, 1, 0, 0),
        "2g.20gb": Profile(2, 19968, 28, 2, 1, 0, 0),
        "3g.40gb": Profile(3, 40192, 42, 3, 2, 0, 0),
        "4g.40gb": Profile(4, 40192, 56, 4, 2, 0, 0),
        "7g.80gb": Profile(7, 80896, 98, 7, 5, 1, 1),
    },
)  # fmt: skip

# H100 80GB HBM3 (p5): utkuozdemir/nvidia_gpu_exporter internal/captures/linux-x86_64__nvidia-h100-mig__590.48.01
# (81559 MiB total, 479 reserved; 1g.10gb 9984 MiB 16 SMs, 2g.20gb 20096 MiB 32 SMs, 3g.40gb 40448 MiB 60 SMs;
# 71 W idle, 700 W limit) and -lgip from jbarrow.ai/field_notes/nvidia-mig (1g.20gb 19.62 GiB 26 SMs, 4g.40gb
# 39.50 GiB 64 SMs, 7g.80gb 79.25 GiB 132 SMs, 8 copy engines).
H100 = Model(
    "NVIDIA H100 80GB HBM3", 81559, 479, 9, 700.0, 71.0, 345, 1980, 2619, 1755, 29.0, 71.0, 0x233010DE, "yes",
    {
        "1g.10gb": Profile(1, 9984, 16, 1, 1, 1, 0),
        "1g.20gb": Profile(1, 20096, 26, 1, 1, 1, 0),
        "2g.20gb": Profile(2, 20096, 32, 2, 2, 2, 0),
        "3g.40gb": Profile(3, 40448, 60, 3, 3, 3, 0),
        "4g.40gb": Profile(4, 40448, 64, 4, 4, 4, 0),
        "7g.80gb": Profile(7, 81152, 132, 8, 7, 7, 1),
    },
)  # fmt: skip

# H200 (p5e, p5en): internal/captures/linux-x86_64__nvidia-h200-mig__590.48.01 in the same repository (name
# "NVIDIA H200", 143771 MiB total, 614 reserved, PCI 0x2335; 1g.18gb 16384 MiB, 2g.35gb 33280 MiB, 3g.71gb
# 71424 MiB with 60 SMs). 1g.35gb and 4g.71gb are taken as the same memory as 2g.35gb and 3g.71gb (as on the
# H100), and 7g.141gb as 140.00 GiB from one -lgip copy: unconfirmed.
H200 = Model(
    "NVIDIA H200", 143771, 614, 9, 700.0, 78.0, 345, 1980, 3201, 1755, 28.0, 70.0, 0x233510DE, "yes",
    {
        "1g.18gb": Profile(1, 16384, 16, 1, 1, 1, 0),
        "1g.35gb": Profile(1, 33280, 26, 1, 1, 1, 0),
        "2g.35gb": Profile(2, 33280, 32, 2, 2, 2, 0),
        "3g.71gb": Profile(3, 71424, 60, 3, 3, 3, 0),
        "4g.71gb": Profile(4, 71424, 64, 4, 4, 4, 0),
        "7g.141gb": Profile(7, 143360, 132, 8, 7, 7, 1),
    },
)  # fmt: skip

A10G = Model("NVIDIA A10G", 23028, 354, 7, 300.0, 16.0, 210, 1710, 6251, 1530, 24.0, 68.0, 0x223710DE, "error")
L40S = Model("NVIDIA L40S", 46068, 533, 8, 350.0, 33.0, 210, 2520, 9001, 1965, 27.0, 73.0, 0x26B910DE, "no")

MODELS = {m.name: m for m in (A100_40GB, A100_80GB, H100, H200, A10G, L40S)}


@dataclass(frozen=True, slots=True)
class Driver:
    """A driver build, as far as the agent can tell builds apart.

    `v3_record_bytes` is the size of each record that `nvmlDeviceGetComputeRunningProcesses_v3` writes, None
    where the driver has no `_v3` entry point. From the history in XuehaiPan/nvitop#88 and PRs #89/#94 and the
    NVML headers of CUDA 12.2.0 and 12.2.2: `_v3` came with 510.39.01 writing the 24-byte v2 record; 535.43.02
    to 535.86 wrote 32 bytes (with usedGpuCcProtectedMemory) under the same name; 535.98 dropped `_v3`;
    535.104.05 brought it back with 24-byte records and moved the 32-byte record to
    nvmlDeviceGetRunningProcessDetailList. nvidia-ml-py 13.x reads 24-byte records.
    """

    version: str
    cuda: int  # nvmlSystemGetCudaDriverVersion: 1000 x major + 10 x minor
    v3_record_bytes: int | None
    detail_list: bool = True  # nvmlDeviceGetRunningProcessDetailList is exported
    conf_compute: bool = True  # nvmlDeviceGetConfComputeMemSizeInfo is exported

    @property
    def nvml_version(self) -> str:
        return f"{self.cuda // 1000}.{self.version}"


# Drivers EC2's GPU AMIs have shipped (AWS Deep Learning AMI release notes: R535 and R550 until 2025, R570,
# R580 and R595 since), plus the builds whose process records differ.
DRIVERS = {
    d.version: d
    for d in (
        Driver("470.256.02", 11040, None, detail_list=False, conf_compute=False),
        Driver("535.54.03", 12020, 32, detail_list=False),
        Driver("535.98", 12020, None, detail_list=False),
        Driver("535.183.01", 12020, 24),
        Driver("550.127.05", 12040, 24),
        # 16-byte records from `_v3`, seen once in a container (XuehaiPan/nvitop PR #226); not reproduced.
        Driver("550.127.08", 12040, 16),
        Driver("570.172.08", 12080, 24),
        Driver("580.105.08", 13000, 24),
    )
}
DEFAULT_DRIVER = "550.127.05"


@dataclass(frozen=True, slots=True)
class Privilege:
    """What the calling process may do, as the NVIDIA driver sees it.

    NVIDIA's MIG user guide ("Device Nodes and Capabilities"): root and CAP_SYS_ADMIN hold every nvidia
    capability implicitly; anyone else needs the capability's device node, and /dev/nvidia-caps/nvidia-cap2
    (mig/monitor, mode 0444) grants the aggregate view of a MIG-mode GPU. Without it NVML answers NO_PERMISSION
    for the parent's memory info and process list (NVML docs of nvmlDeviceGetMemoryInfo_v2 and
    nvmlDeviceGetComputeRunningProcesses_v3; NVIDIA/k8s-device-plugin#399 and #1683, IDSIA/sacred#864).
    GPM reads GPU counters, which the driver keeps for admins unless NVreg_RestrictProfilingToAdminUsers=0
    (NVIDIA's ERR_NVGPUCTRPERM page); nvmlGpmSampleGet answering 4, NO_PERMISSION, is in NVIDIA/DCGM#214.
    Whether GPM follows that driver option is not documented: the fake assumes it does.
    """

    admin: bool = True
    mig_monitor: bool = True
    profiling_admin_only: bool = True

    @property
    def aggregate_mig(self) -> bool:
        return self.admin or self.mig_monitor

    @property
    def profiling(self) -> bool:
        return self.admin or not self.profiling_admin_only


PRIVILEGES = {
    "admin": Privilege(),
    # The agent's systemd unit: root without capabilities, with the MIG monitor node.
    "monitor": Privilege(admin=False, mig_monitor=True),
    "none": Privilege(admin=False, mig_monitor=False),
}
