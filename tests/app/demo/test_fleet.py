"""The demo fleet: the stories first, background after, every figure a function of the seed."""

from __future__ import annotations

import pytest

from agent import fake_nvml
from app.demo.fleet import BACKGROUND, DAY, GRID_S, HOUR, STORIES, Story, make_fleet
from app.pricing import load_catalog

EPOCH = 1_768_402_800  # 2026-01-14 15:00 UTC, a Wednesday


def test_the_same_seed_makes_the_same_fleet_and_another_seed_another() -> None:
    one = make_fleet(12, seed=1, epoch=EPOCH)
    assert one == make_fleet(12, seed=1, epoch=EPOCH)
    other = make_fleet(12, seed=2, epoch=EPOCH)
    assert [i.instance_id for i in one.instances] != [i.instance_id for i in other.instances]
    assert [i.scenario for i in one.instances] == [i.scenario for i in other.instances]


def test_stories_come_first_and_more_instances_add_background() -> None:
    fleet = make_fleet(len(STORIES) + 2 * len(BACKGROUND) + 1, seed=1, epoch=EPOCH)
    stories = [i.story for i in fleet.instances]
    assert stories[: len(STORIES)] == list(STORIES)
    assert stories[len(STORIES) :] == [*BACKGROUND, *BACKGROUND, BACKGROUND[0]]
    assert len({i.instance_id for i in fleet.instances}) == len(fleet.instances)
    assert len({i.tags["Name"] for i in fleet.instances}) == len(fleet.instances)
    assert len({i.nvml_seed for i in fleet.instances}) == len(fleet.instances)
    assert all(i.tags["team"] for i in fleet.instances)
    # Growing the fleet leaves the instances it had alone.
    assert fleet.instances[:12] == make_fleet(12, seed=1, epoch=EPOCH).instances


@pytest.mark.parametrize("size", [0, len(STORIES) - 1, 501])
def test_fleet_size_is_bounded(size: int) -> None:
    with pytest.raises(ValueError, match="instances"):
        make_fleet(size, seed=1, epoch=EPOCH)


def story_name(story: Story) -> str:
    return story.name


@pytest.mark.parametrize("story", list(dict.fromkeys([*STORIES, *BACKGROUND])), ids=story_name)
def test_each_scenario_is_the_hardware_of_its_instance_type(story: Story) -> None:
    entry = load_catalog()[story.instance_type]
    lib = fake_nvml.load(story.scenario, clock=lambda: 0.0)
    lib.nvmlInit()
    try:
        assert lib.nvmlDeviceGetCount() == entry.gpu_count
        name = lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(0))
        assert entry.nvml_name is None or name.startswith(entry.nvml_name)
    finally:
        lib.nvmlShutdown()


def test_only_spot_instances_go_away_on_the_grid_for_one_to_five_hours() -> None:
    fleet = make_fleet(len(STORIES) + len(BACKGROUND), seed=1, epoch=EPOCH)
    t0, t1 = EPOCH - 14 * DAY, EPOCH
    for inst in fleet.instances:
        spans = fleet.offline(inst, t0, t1)
        if inst.story.capacity_block:
            continue
        if not inst.spot:
            assert spans == []
            continue
        assert 3 <= len(spans) <= 20, inst.tags["Name"]
        for a, b in spans:
            assert a % GRID_S == 0 and b % GRID_S == 0
            assert HOUR <= b - a <= 5 * HOUR
            assert not fleet.online(inst, (a + b) / 2)
            assert fleet.online(inst, a - 1) or any(x < a <= y for x, y in spans)
    assert sum(i.spot for i in fleet.instances[: len(STORIES)]) == 3


def test_identity_carries_the_team_tag_and_lifecycle() -> None:
    fleet = make_fleet(len(STORIES), seed=1, epoch=EPOCH)
    wire = {i.tags["Name"]: i.identity().to_wire() for i in fleet.instances}
    g5 = wire["vision-finetune-dev"]
    assert g5["instance_type"] == "g5.xlarge"
    assert g5["lifecycle"] == "on-demand"
    assert g5["tags"] == {"Name": "vision-finetune-dev", "team": "vision", "env": "dev"}
    assert wire["embeddings-spot"]["lifecycle"] == "spot"
    assert str(g5["availability_zone"]).startswith("us-west-2")


def test_the_capacity_block_instance_runs_only_in_its_block_less_its_stop() -> None:
    fleet = make_fleet(len(STORIES), seed=1, epoch=EPOCH)
    [inst] = [i for i in fleet.instances if i.story.capacity_block]
    block = fleet.block(inst)
    assert block is not None and all(fleet.block(i) is None for i in fleet.instances if i is not inst)
    # Blocks start and end at 11:30 UTC and last whole days; this one has ended over a day before the epoch.
    assert block.start % DAY == block.end % DAY == 11 * HOUR + 1800
    assert block.end - block.start == 4 * DAY and block.end < EPOCH - DAY
    a, b = block.down
    assert block.start < a < b < block.end and b - a == 7 * HOUR
    assert a % GRID_S == 0 and a % HOUR != 0, "stopped mid-hour: its bill has a part hour on each side"
    assert [
        t for t in (block.start - 1, block.start, a - 1, a, b, block.end - 1, block.end) if fleet.online(inst, t)
    ] == [
        block.start,
        a - 1,
        b,
        block.end - 1,
    ]
    assert not inst.spot and inst.identity().lifecycle == "on-demand"
