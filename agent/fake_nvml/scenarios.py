"""The simulated hosts: which GPUs, MIG layouts, loads and processes each scenario has, and who runs them."""

from __future__ import annotations

from dataclasses import dataclass

from .curves import (
    HOUR,
    NO_LOAD,
    Load,
    ending,
    jobs,
    office,
    steady,
)
from .hardware import A10G, A100_40GB, DEFAULT_DRIVER, H100, L40S, Driver, Model

SCENARIOS: dict[str, str] = {
    "p4d-mig": "p4d.24xlarge: 8x A100-SXM4-40GB; GPUs 0-3 in MIG mode (mixed layouts, a sparse index), 4-7 whole",
    "p4d-mig-unprivileged": "p4d-mig read without the MIG monitor capability (root without capabilities, no "
    "/dev/nvidia-caps/nvidia-cap2): NVML refuses the MIG-mode GPUs' memory and process lists",
    "p5-mig": "p5.48xlarge: 8x H100 80GB HBM3, all in MIG mode with mixed profiles and free slices; GPM",
    "p5": "p5.48xlarge: 8x H100 80GB HBM3, MIG off, varied load; GPM",
    "g5-idle": "g5.xlarge: 1x A10G, mostly idle (short bursts of work), no processes",
    "g5-notebook": "g5.xlarge: 1x A10G, idle but for a user's Jupyter kernel (python3, user asmith) holding 9 GiB",
    "g6e-busy": "g6e.12xlarge: 4x L40S, busy 80-100% with most memory held; ECC off on GPU 2",
    "p4d-train": "p4d.24xlarge: 8x A100-SXM4-40GB training on weekdays from 8-10 to 18-20 (UTC-5), "
    "idle with no process at night and at weekends (clock: UTC epoch seconds); Slurm job 48213 of mchen, cgroup v1",
    "g5-forgotten": "g5.xlarge: 1x A10G, a fine-tuning job until 102 h before the epoch, idle and empty since",
    "p5-inference": "p5.48xlarge: 8x H100 80GB HBM3 in MIG mode serving inference: two slices unused, "
    "one compute slice in no GPU instance; a vLLM pod of namespace inference per slice (containerd); GPM",
    "g5-batch": "g5.12xlarge: 4x A10G running batch jobs of 15 minutes that start and stop, in Docker "
    "containers (cgroup v1)",
    "p4d-shared": "p4d.24xlarge: 8x A100-SXM4-40GB, all in MIG mode and shared: NVML measures no slice "
    "utilization; one slice has no process; pods of namespace research, cgroup v1",
    "p5-mig-crowded": "p5.48xlarge: 8x H100 80GB HBM3, each split into seven 1g.10gb slices with three "
    "processes on every slice (168 holders in pods of namespace embed); GPM",
    "p5-train": "p5.48xlarge: 8x H100 80GB HBM3, MIG off, training at 80-90% with short pauses; GPM",
    "no-gpu": "a host whose driver loads but sees no GPU",
    "no-driver": "a host without the NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound",
}


@dataclass(frozen=True, slots=True)
class Who:
    """Who runs a device's processes, as the host's /proc shows them (`procfs`): user, executable and its
    arguments, how many hours before the epoch they started, and what they run in: a Slurm job (and step), a
    Docker container, a Kubernetes pod (namespace, and the workload its name starts with), or else a login
    session. Each device has a container or pod of its own; a Slurm job spans the devices that name it."""

    user: str
    uid: int
    executable: str
    args: tuple[str, ...] = ()
    age_h: float = 2.0
    slurm_job: int | None = None
    slurm_step: str = "0"
    docker: bool = False
    pod: tuple[str, str] | None = None


SOMEONE = Who("ubuntu", 1000, "python3", ("python3", "train.py"))


@dataclass(frozen=True, slots=True)
class CiSpec:
    index: int  # MIG device index under the parent
    ci_id: int
    slices: int  # compute slices of this compute instance (at most its GPU instance's)
    load: Load
    procs_mib: tuple[int, ...] = ()
    uuid: str | None = None  # a replayed report's; None: made up from the scenario's seed
    who: Who | None = None  # None: the scenario's


@dataclass(frozen=True, slots=True)
class GiSpec:
    gi_id: int
    profile: str
    cis: tuple[CiSpec, ...]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    load: Load = NO_LOAD
    procs_mib: tuple[int, ...] = ()
    mig: tuple[GiSpec, ...] | None = None
    ecc: bool = True
    model: Model | None = None  # None: the scenario's
    uuid: str | None = None
    mig_pending: bool | None = None  # a MIG mode waiting for a GPU reset; None: none pending
    who: Who | None = None  # who runs its processes (a MIG device's, unless it names its own); None: the scenario's


def gi(gi_id: int, profile: str, index: int, load: Load, *procs_mib: int, who: Who | None = None) -> GiSpec:
    """A GPU instance holding one compute instance of its full size."""
    slices = int(profile.split("g", 1)[0])
    return GiSpec(gi_id, profile, (CiSpec(index, 0, slices, load, procs_mib, who=who),))


@dataclass(frozen=True, slots=True)
class FailureSpec:
    """Calls of `function` answer NVML error `error`: on every device, on GPU `gpu` (and its MIG devices unless
    `gpu_only`), or on its MIG device `slice_index`."""

    function: str
    error: int
    gpu: int | None = None
    slice_index: int | None = None
    gpu_only: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    model: Model | None
    gpus: tuple[GpuSpec, ...]
    bus_ids: tuple[int, ...] = ()
    has_driver: bool = True
    driver: str | Driver = DEFAULT_DRIVER  # a key of DRIVERS, or a build only a replayed report knows
    privilege: str = "admin"
    failures: tuple[FailureSpec, ...] = ()
    # The utilization sample buffer: about 6 samples a second, about 100 kept (mindprince/gonvml bindings.go);
    # NVML's own docs give a sample period between 1/6 s and 1 s by product.
    sample_period_us: int = 166_667
    sample_slots: int = 100
    who: Who = SOMEONE  # who runs the processes of devices that do not say
    cgroups: int = 2  # the cgroup version of the host's /proc/<pid>/cgroup files


VLLM_ARGS = ("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000")
RESEARCH = ("research", "fit-7b")
KERNEL_FILE = "/home/asmith/.local/share/jupyter/runtime/kernel-5f0c2a8e-3b1d-4c6e-9a7f-2d8b4e1c6a90.json"
# A notebook's kernel is the process holding the GPU: ipykernel, started by jupyter-lab as the user.
NOTEBOOK = Who(
    "asmith", 1003, "python3", ("/home/asmith/.venv/bin/python3", "-m", "ipykernel_launcher", "-f", KERNEL_FILE), 26.0
)
SERVER = Who("ubuntu", 1000, "python3", ("python3", "serve.py", "--port", "8080"), 30.0, docker=True)


def scenario(name: str) -> Scenario:
    if name in ("p4d-mig", "p4d-mig-unprivileged"):
        return Scenario(
            A100_40GB,
            (
                GpuSpec(
                    mig=(
                        gi(7, "1g.5gb", 0, jobs(20, 85, 0.7), 3800, who=SERVER),
                        gi(8, "1g.5gb", 1, NO_LOAD),
                        gi(9, "1g.5gb", 2, steady(75), 4200),
                        gi(10, "1g.5gb", 3, NO_LOAD, 4000),
                        gi(11, "1g.5gb", 4, jobs(10, 60, 0.5), 2000),
                        gi(12, "1g.5gb", 5, NO_LOAD),
                        gi(13, "1g.5gb", 6, steady(35), 1500),
                    )
                ),
                GpuSpec(
                    mig=(
                        gi(2, "3g.20gb", 0, steady(60), 12000, 3000),
                        gi(3, "2g.10gb", 1, jobs(15, 70, 0.6), 6000),
                        gi(9, "1g.5gb", 2, NO_LOAD),
                    )
                ),
                GpuSpec(mig=(gi(1, "4g.20gb", 0, steady(85), 18000), gi(2, "3g.20gb", 1, jobs(30, 90, 0.5), 9000))),
                GpuSpec(
                    mig=(
                        # One 2g GPU instance split into two 1-slice compute instances; MIG index 1 is empty.
                        GiSpec(3, "2g.10gb", (CiSpec(0, 0, 1, steady(50), (3000,)), CiSpec(2, 1, 1, NO_LOAD))),
                        gi(2, "3g.20gb", 3, jobs(10, 80, 0.4), 14000),
                    )
                ),
                GpuSpec(jobs(10, 90, 0.6), (22000, 4000)),
                GpuSpec(steady(88), (36000,)),
                GpuSpec(NO_LOAD, (30000,), who=NOTEBOOK),  # idle-held: memory allocated, nothing running
                GpuSpec(NO_LOAD),
            ),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
            privilege="none" if name == "p4d-mig-unprivileged" else "admin",
        )
    if name == "p5-mig":
        return Scenario(
            H100,
            (
                GpuSpec(
                    mig=(
                        gi(7, "1g.10gb", 0, steady(80), 8000),
                        gi(8, "1g.10gb", 1, jobs(20, 90, 0.6), 6000),
                        gi(9, "1g.10gb", 2, NO_LOAD),
                        gi(10, "1g.10gb", 3, steady(45), 5000),
                        gi(11, "1g.10gb", 4, NO_LOAD, 7000),
                        gi(12, "1g.10gb", 5, jobs(10, 50, 0.4), 3000),
                        gi(13, "1g.10gb", 6, steady(20), 2000),
                    )
                ),
                GpuSpec(
                    mig=(
                        gi(2, "3g.40gb", 0, steady(70), 30000),
                        gi(3, "2g.20gb", 1, jobs(15, 85, 0.5), 12000),
                        gi(9, "1g.10gb", 2, NO_LOAD),
                    )
                ),
                GpuSpec(mig=(gi(1, "4g.40gb", 0, steady(90), 38000), gi(2, "3g.40gb", 1, steady(30), 20000))),
                GpuSpec(mig=(gi(0, "7g.80gb", 0, jobs(40, 90, 0.8), 70000),)),
                GpuSpec(
                    mig=(
                        gi(3, "2g.20gb", 0, steady(65), 15000),
                        gi(4, "2g.20gb", 1, NO_LOAD, 10000),
                        gi(5, "2g.20gb", 2, jobs(20, 75, 0.5), 9000),
                        gi(13, "1g.10gb", 3, steady(10), 1000),
                    )
                ),
                GpuSpec(
                    mig=(
                        gi(9, "1g.20gb", 0, steady(55), 16000),
                        gi(10, "1g.20gb", 1, NO_LOAD),
                        gi(11, "1g.20gb", 2, jobs(10, 60, 0.3), 8000),
                        gi(12, "1g.20gb", 3, NO_LOAD),
                    )
                ),
                GpuSpec(mig=(gi(1, "3g.40gb", 0, steady(85), 35000), gi(2, "3g.40gb", 1, jobs(5, 40, 0.5), 12000))),
                GpuSpec(mig=(gi(1, "4g.40gb", 0, NO_LOAD, 25000),)),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "p5":
        return Scenario(
            H100,
            (
                GpuSpec(steady(90), (70000,)),
                GpuSpec(steady(82), (65000,)),
                GpuSpec(jobs(20, 90, 0.7), (40000,)),
                GpuSpec(jobs(10, 70, 0.5), (30000, 8000)),
                GpuSpec(steady(60), (50000,)),
                GpuSpec(NO_LOAD, (40000,)),
                GpuSpec(NO_LOAD),
                GpuSpec(jobs(5, 50, 0.3), (12000,)),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "g5-idle":
        return Scenario(A10G, (GpuSpec(jobs(3, 25, 0.1, 240.0)),), (0x1E,))
    if name == "g5-notebook":
        return Scenario(A10G, (GpuSpec(NO_LOAD, (9216,)),), (0x1E,), who=NOTEBOOK)
    if name == "p5-mig-crowded":
        crowded = tuple(gi(7 + k, "1g.10gb", k, steady(30 + 8 * k), 2000, 1500, 1000) for k in range(7))
        return Scenario(
            H100,
            tuple(GpuSpec(mig=crowded) for _ in range(8)),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
            who=Who("root", 0, "python3", ("python3", "-m", "embedder.worker"), 7.5, pod=("embed", "embed-worker")),
        )
    if name == "g6e-busy":
        return Scenario(
            L40S,
            (
                GpuSpec(steady(90), (42000,)),
                GpuSpec(steady(90), (40000, 2500)),
                GpuSpec(steady(89), (43000,), ecc=False),
                GpuSpec(steady(90), (41000,)),
            ),
            (0x38, 0x3A, 0x3C, 0x3E),
        )
    if name == "p4d-train":
        work = office(78, 90, -5)
        return Scenario(
            A100_40GB,
            tuple(GpuSpec(work, (30000 + 1000 * i,)) for i in range(8)),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
            who=Who("mchen", 1207, "python3", ("python3", "-u", "train.py", "--config", "llama-7b.yaml"), 3.0, 48213),
            cgroups=1,
        )
    if name == "g5-forgotten":
        job = ending(steady(55.0), -102 * HOUR)
        return Scenario(A10G, (GpuSpec(job, (17500,)),), (0x1E,))
    if name == "p5-inference":
        serve = jobs(30, 80, 0.85, 600.0)
        return Scenario(
            H100,
            (
                GpuSpec(mig=tuple(gi(7 + k, "1g.10gb", k, steady(40 + 6 * k), 6000 + 300 * k) for k in range(7))),
                GpuSpec(
                    mig=(
                        gi(2, "3g.40gb", 0, steady(72), 32000),
                        gi(3, "2g.20gb", 1, serve, 14000),
                        gi(4, "2g.20gb", 2, steady(48), 15000),
                    )
                ),
                GpuSpec(mig=(gi(1, "4g.40gb", 0, steady(81), 36000), gi(2, "3g.40gb", 1, serve, 28000))),
                GpuSpec(mig=(gi(0, "7g.80gb", 0, steady(66), 72000),)),
                GpuSpec(
                    mig=(
                        gi(2, "3g.40gb", 0, steady(58), 30000),
                        gi(3, "2g.20gb", 1, serve, 12000),
                        gi(9, "1g.10gb", 2, steady(35), 5000),
                        gi(10, "1g.10gb", 3, NO_LOAD),  # unused
                    )
                ),
                GpuSpec(
                    mig=(
                        gi(3, "2g.20gb", 0, steady(62), 16000),
                        gi(4, "2g.20gb", 1, NO_LOAD),  # unused
                        gi(5, "2g.20gb", 2, serve, 13000),
                        gi(13, "1g.10gb", 3, steady(44), 6000),
                    )
                ),
                GpuSpec(
                    mig=(
                        gi(1, "4g.40gb", 0, steady(76), 34000),
                        gi(5, "2g.20gb", 1, serve, 15000),
                        gi(13, "1g.10gb", 2, steady(52), 7000),
                    )
                ),
                # 3 + 2 + 1 of 7 compute slices: one was never made into a GPU instance.
                GpuSpec(
                    mig=(
                        gi(2, "3g.40gb", 0, steady(69), 31000),
                        gi(3, "2g.20gb", 1, serve, 14000),
                        gi(9, "1g.10gb", 2, steady(38), 6000),
                    )
                ),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
            who=Who("root", 0, "vllm", VLLM_ARGS, 50.0, pod=("inference", "vllm-llama-3-1-8b")),
        )
    if name == "g5-batch":
        return Scenario(
            A10G,
            (
                GpuSpec(jobs(40, 90, 0.6, 900.0), (18000,)),
                GpuSpec(jobs(40, 90, 0.6, 900.0), (18500,)),
                GpuSpec(jobs(30, 90, 0.5, 900.0), (12000,)),
                GpuSpec(jobs(30, 90, 0.5, 900.0), (11000,)),
            ),
            (0x1B, 0x1C, 0x1D, 0x1E),
            who=Who("root", 0, "python3", ("python3", "/app/batch.py", "--shard", "auto"), 0.1, docker=True),
            cgroups=1,
        )
    if name == "p4d-shared":
        return Scenario(
            A100_40GB,
            (
                GpuSpec(mig=tuple(gi(7 + k, "1g.5gb", k, jobs(20, 80, 0.7), 3500 + 100 * k) for k in range(7))),
                GpuSpec(mig=(gi(1, "4g.20gb", 0, steady(70), 17000), gi(2, "3g.20gb", 1, steady(55), 15000))),
                GpuSpec(mig=(gi(0, "7g.40gb", 0, jobs(40, 90, 0.8), 36000),)),
                GpuSpec(
                    mig=(
                        gi(2, "3g.20gb", 0, steady(64), 16000),
                        gi(3, "2g.10gb", 1, jobs(15, 70, 0.6), 8000),
                        gi(9, "1g.5gb", 2, steady(40), 4000),
                        gi(10, "1g.5gb", 3, NO_LOAD),  # no process
                    )
                ),
                GpuSpec(mig=(gi(1, "4g.20gb", 0, jobs(30, 90, 0.6), 18000), gi(2, "3g.20gb", 1, steady(48), 14000))),
                GpuSpec(
                    mig=(
                        gi(2, "3g.20gb", 0, steady(45), 14000),
                        gi(3, "2g.10gb", 1, steady(35), 8000),
                        gi(4, "2g.10gb", 2, jobs(20, 80, 0.7), 8000),
                    )
                ),
                GpuSpec(mig=(gi(0, "7g.40gb", 0, steady(82), 38000),)),
                GpuSpec(mig=(gi(2, "3g.20gb", 0, jobs(20, 85, 0.7), 15000), gi(1, "4g.20gb", 1, steady(60), 18000))),
            ),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
            who=Who("jovyan", 1000, "python3", ("python3", "-m", "torch.distributed.run", "fit.py"), pod=RESEARCH),
            cgroups=1,
        )
    if name == "p5-train":
        return Scenario(
            H100,
            tuple(GpuSpec(jobs(80, 90, 0.97, 1800.0), (72000 + 500 * i,)) for i in range(8)),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "no-gpu":
        return Scenario(None, ())
    if name == "no-driver":
        return Scenario(None, (), has_driver=False)
    raise ValueError(f"unknown fake NVML scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
