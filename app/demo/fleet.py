"""The demo's fleet: which simulated instances exist, what each runs, and when the spot ones (and the one in a
Capacity Block) are away.

Every instance is a scenario of the agent's fake NVML (`agent/fake_nvml/`) with a seed of its own, plus the
EC2 identity its simulated instance metadata gives. The first instances tell the stories the product exists
for; a larger fleet adds background instances after them. Everything is a function of the fleet seed and
the epoch (the moment the stories are told from), so a fleet made again is the same fleet.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from agent.identify import Identity

HOUR = 3600
DAY = 86400
GRID_S = 300
"""Spot gaps and history before the last hours lie on this grid (s): whole 5-minute buckets."""
DEFAULT_SEED = 1
AMI_ID = "ami-0c7217cdde317cfec"


@dataclass(frozen=True)
class Story:
    """One instance of the fleet as the stories need it (a background instance has no `legend`)."""

    scenario: str
    instance_type: str
    region: str
    lifecycle: str
    team: str
    name: str
    env: str
    legend: str | None = None
    page: str | None = None
    """Where the story shows; `{instance_id}` stands for the story's own instance."""
    capacity_block: bool = False
    """It lives in a Capacity Block for ML (`DemoFleet.block`): launched when the block starts, ended when it
    ends."""


# The stories, in the order they are told. Each fake NVML scenario matches its instance type.
STORIES: tuple[Story, ...] = (
    Story(
        "p4d-train",
        "p4d.24xlarge",
        "us-east-1",
        "on-demand",
        "ml-research",
        "llm-pretrain-a",
        "research",
        "two p4d.24xlarge of team ml-research train on weekdays and sit idle at night and at weekends",
        "/heatmap/week?tag=team:ml-research",
    ),
    Story("p4d-train", "p4d.24xlarge", "us-east-1", "on-demand", "ml-research", "llm-pretrain-b", "research"),
    Story(
        "g5-forgotten",
        "g5.xlarge",
        "us-west-2",
        "on-demand",
        "vision",
        "vision-finetune-dev",
        "dev",
        "a g5.xlarge of team vision finished its job 102 h before the demo began and was left running",
        "/gpus/idle",
    ),
    Story(
        "p5-inference",
        "p5.48xlarge",
        "us-east-1",
        "on-demand",
        "inference",
        "inference-serving",
        "prod",
        "an inference p5.48xlarge split into MIG slices: two slices unused, one compute slice never partitioned",
        "/mig",
    ),
    Story(
        "p4d-shared",
        "p4d.24xlarge",
        "us-east-1",
        "on-demand",
        "ml-platform",
        "shared-a100-mig",
        "staging",
        "a shared A100 node in MIG mode: NVML cannot measure its slices, so their utilization is unknown",
        "/mig",
    ),
    Story(
        "p4d-mig-unprivileged",
        "p4d.24xlarge",
        "us-east-1",
        "on-demand",
        "ml-platform",
        "a100-mig-locked-down",
        "prod",
        "an A100 MIG host whose agent lacks the MIG monitor capability: its page says which figures are missing "
        "and what to grant",
        "/instances/{instance_id}",
    ),
    Story(
        "g6e-busy",
        "g6e.12xlarge",
        "us-east-1",
        "spot",
        "ml-platform",
        "embeddings-spot",
        "prod",
        "three spot instances come and go: hours offline, then back",
        "/instances",
    ),
    Story("g5-batch", "g5.12xlarge", "us-west-2", "spot", "vision", "vision-batch-spot", "research"),
    Story("g5-batch", "g5.12xlarge", "eu-west-1", "spot", "speech", "speech-batch-spot", "research"),
    Story(
        "p5-train",
        "p5.48xlarge",
        "us-east-1",
        "on-demand",
        "ml-research",
        "llm-finetune-block",
        "research",
        "a p5.48xlarge of team ml-research ran 4 days in a Capacity Block for ML and was stopped 7 h of them: "
        "the block is paid whether it runs, so its offline hours cost money, as idle waste",
        "/instances/{instance_id}",
        capacity_block=True,
    ),
)

# Background instances, taken in turn once the stories are placed.
BACKGROUND: tuple[Story, ...] = (
    Story("p5-train", "p5.48xlarge", "us-east-1", "on-demand", "ml-research", "research-p5", "research"),
    Story("g6e-busy", "g6e.12xlarge", "us-west-2", "on-demand", "inference", "inference-l40s", "prod"),
    Story("g5-batch", "g5.12xlarge", "us-east-1", "on-demand", "speech", "speech-train", "research"),
    Story("p4d-train", "p4d.24xlarge", "us-east-1", "on-demand", "vision", "vision-train", "research"),
    Story("p5-mig", "p5.48xlarge", "us-west-2", "on-demand", "inference", "inference-mig", "prod"),
    Story("g5-batch", "g5.12xlarge", "eu-west-1", "spot", "vision", "vision-batch", "research"),
)
DEFAULT_INSTANCES = len(STORIES) + 4
STORIES_DIGEST = hashlib.blake2b(repr((STORIES, BACKGROUND)).encode(), digest_size=6).hexdigest()
"""Changes with the stories or the background: a demo folder made with other ones starts over."""
MAX_INSTANCES = 500

_ZONES = "abcd"
BLOCK_DAYS = 4
"""The Capacity Block's length. Blocks start and end at 11:30 UTC and last whole days."""
BLOCK_START_S = 11 * HOUR + 30 * 60
BLOCK_BEFORE_DAYS = 6
"""The block starts this many days before the epoch's day: it has ended, and the bill (a day behind) has all of
it, so its upfront fee is spread over all its hours (docs/billing.md)."""
BLOCK_DOWN = (DAY + 2 * HOUR + 40 * 60, 7 * HOUR)
"""When in the block its instance is stopped (s from the block's start) and for how long: 14:10 to 21:10 UTC of
its second day."""
_FOREVER = 1 << 40
"""UTC epoch s far past any demo: the end of "away" once an instance has ended."""


def digest(*parts: object) -> int:
    """64 bits that depend only on `parts`: the same in every process and run."""
    text = "/".join(map(str, ("gpufleet-demo", *parts)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class SimInstance:
    """One simulated EC2 instance: its identity, its fake NVML scenario and seed, and its story."""

    key: int
    instance_id: str
    story: Story
    nvml_seed: int
    zone: str
    hostname: str
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def scenario(self) -> str:
        return self.story.scenario

    @property
    def spot(self) -> bool:
        return self.story.lifecycle == "spot"

    def metadata(self) -> dict[str, str]:
        """What its instance metadata service answers under `/latest/meta-data/`."""
        return {
            "instance-id": self.instance_id,
            "instance-type": self.story.instance_type,
            "ami-id": AMI_ID,
            "placement/region": self.story.region,
            "placement/availability-zone": self.zone,
            "instance-life-cycle": "spot" if self.spot else "on-demand",
            "hostname": self.hostname,
        }

    def identity(self) -> Identity:
        """The identity an agent on this instance reports (it reads the metadata above)."""
        return Identity(
            instance_id=self.instance_id,
            hostname=self.hostname,
            instance_type=self.story.instance_type,
            region=self.story.region,
            availability_zone=self.zone,
            lifecycle=self.story.lifecycle,
            ami_id=AMI_ID,
            tags=dict(self.tags),
            source="imds",
        )


@dataclass(frozen=True)
class Block:
    """A Capacity Block for ML, UTC epoch s: reserved over [start, end), with its instance stopped over `down`."""

    start: int
    end: int
    down: tuple[int, int]

    def away(self) -> list[tuple[int, int]]:
        """When its instance does not run: before the block, while stopped, and once the block has ended."""
        return [(0, self.start), self.down, (self.end, _FOREVER)]


@dataclass(frozen=True)
class DemoFleet:
    seed: int
    epoch: int
    """UTC epoch seconds the stories are told from (the first start of the demo, on the 5-minute grid)."""
    instances: tuple[SimInstance, ...]

    def block(self, inst: SimInstance) -> Block | None:
        """The Capacity Block `inst` lives in, if its story has one: BLOCK_DAYS long, from 11:30 UTC
        BLOCK_BEFORE_DAYS before the epoch's day."""
        if not inst.story.capacity_block:
            return None
        start = (self.epoch // DAY - BLOCK_BEFORE_DAYS) * DAY + BLOCK_START_S
        down = start + BLOCK_DOWN[0]
        return Block(start, start + BLOCK_DAYS * DAY, (down, down + BLOCK_DOWN[1]))

    def offline(self, inst: SimInstance, t0: float, t1: float) -> list[tuple[int, int]]:
        """The spans (UTC epoch s) in which an instance is away that overlap [t0, t1). A spot instance: 35 % of
        12-hour blocks hold one, of 1 to 5 hours, on the 5-minute grid. A Capacity Block's instance: all but the
        block, and its stop inside it (`Block.away`). Other on-demand instances are never away."""
        reserved = self.block(inst)
        if reserved is not None:
            return [(a, b) for a, b in reserved.away() if a < t1 and b > t0]
        if not inst.spot:
            return []
        block_s = 12 * HOUR
        out: list[tuple[int, int]] = []
        for block in range(int(t0) // block_s - 1, int(t1) // block_s + 1):
            h = digest(self.seed, inst.key, "gap", block)
            if h % 100 >= 35:
                continue
            a = block * block_s + (h >> 8) % (block_s // GRID_S) * GRID_S
            b = a + HOUR + (h >> 20) % (4 * HOUR // GRID_S + 1) * GRID_S
            if a < t1 and b > t0:
                out.append((a, b))
        return out

    def online(self, inst: SimInstance, t: float) -> bool:
        return not self.offline(inst, t, t + 1e-3)


def make_fleet(instances: int, *, seed: int, epoch: int) -> DemoFleet:
    """The stories, then background instances up to `instances` in all."""
    if not len(STORIES) <= instances <= MAX_INSTANCES:
        raise ValueError(f"the demo fleet has {len(STORIES)} to {MAX_INSTANCES} instances, not {instances}")
    made: list[SimInstance] = []
    for key in range(instances):
        story = STORIES[key] if key < len(STORIES) else BACKGROUND[(key - len(STORIES)) % len(BACKGROUND)]
        h = digest(seed, key)
        suffix = "" if key < len(STORIES) + len(BACKGROUND) else f"-{(key - len(STORIES)) // len(BACKGROUND) + 1}"
        octets = (key // 250, key % 250 + 10)
        domain = "ec2.internal" if story.region == "us-east-1" else f"{story.region}.compute.internal"
        made.append(
            SimInstance(
                key=key,
                instance_id=f"i-0{h:016x}",
                story=story,
                nvml_seed=seed * 1000 + key,
                zone=story.region + _ZONES[h % 3],
                hostname=f"ip-10-{20 + seed % 200}-{octets[0]}-{octets[1]}.{domain}",
                tags={"Name": story.name + suffix, "team": story.team, "env": story.env},
            )
        )
    return DemoFleet(seed, epoch, tuple(made))
