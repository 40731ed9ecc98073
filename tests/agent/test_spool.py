from __future__ import annotations

import json
from pathlib import Path

from agent.spool import Journal, Spool, dumps


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_batches_come_back_in_order_and_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(3):
        spool.put(f"batch {i}".encode())
    again = Spool(tmp_path)
    assert [again.read(b) for b in again.pending()] == [b"batch 0", b"batch 1", b"batch 2"]
    oldest = again.oldest()
    assert oldest is not None
    again.remove(oldest)
    assert again.put(b"batch 3").seq == 4
    assert [Spool(tmp_path).read(b) for b in Spool(tmp_path).pending()] == [b"batch 1", b"batch 2", b"batch 3"]


def test_half_written_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / ".000000000001-1-0.gz.tmp").write_bytes(b"torn")
    (tmp_path / "notes.txt").write_text("not a batch")
    spool = Spool(tmp_path)
    assert spool.pending() == []
    assert not (tmp_path / ".000000000001-1-0.gz.tmp").exists()


def test_size_bound_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=250)
    for i in range(5):
        spool.put(bytes([i]) * 100)
    kept = spool.pending()
    assert [spool.read(b) for b in kept] == [bytes([3]) * 100, bytes([4]) * 100]
    assert spool.take_dropped() == 3
    assert spool.take_dropped() == 0


def test_a_dropped_batch_passes_on_the_drops_it_was_carrying(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=150)
    spool.put(b"x" * 100, carried=4)
    spool.put(b"y" * 100)
    assert spool.take_dropped() == 5


def test_age_bound(tmp_path: Path) -> None:
    clock = Clock()
    spool = Spool(tmp_path, max_age_s=3600, wall_clock=clock)
    spool.put(b"old")
    clock.t += 1800
    spool.put(b"newer")
    clock.t += 1900
    oldest = spool.oldest()
    assert oldest is not None and spool.read(oldest) == b"newer"
    assert spool.take_dropped() == 1


def test_the_drop_count_survives_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10)
    spool.put(b"a" * 20)
    spool.put(b"b" * 20)
    assert Spool(tmp_path).take_dropped() == 1


def test_rejected_batches_are_moved_aside_with_the_reason(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    batch = spool.put(b"bad")
    target = spool.reject(batch, "HTTP 422: intervals.0.start: in the future")
    assert spool.pending() == [] and Spool(tmp_path).pending() == []
    assert target.read_bytes() == b"bad"
    assert "in the future" in (target.parent / (batch.path.stem + ".reason.txt")).read_text()


def test_journal_keeps_appended_records_and_drops_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "open.jsonl")
    journal.append({"t": "head", "batch_id": "b1"})
    journal.append({"t": "interval", "n": 1})
    journal.close()
    with open(tmp_path / "open.jsonl", "ab") as f:
        f.write(b'{"t": "interval", "n"')  # the process died mid-write
    assert Journal(tmp_path / "open.jsonl").load() == [{"t": "head", "batch_id": "b1"}, {"t": "interval", "n": 1}]


def test_journal_clear_removes_the_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "open.jsonl")
    journal.append({"t": "head"})
    journal.clear()
    assert not (tmp_path / "open.jsonl").exists()
    assert journal.load() == []


def test_a_torn_line_in_the_middle_costs_that_record_only(tmp_path: Path) -> None:
    path = tmp_path / "open.jsonl"
    path.write_bytes(b'{"t": "head"}\n{"t": "interval", "n"\n{"t": "interval", "n": 2}\n')
    assert Journal(path).load() == [{"t": "head"}, {"t": "interval", "n": 2}]


def test_the_byte_count_follows_puts_removals_and_restarts(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = spool.put(b"a" * 100)
    spool.put(b"b" * 50)
    assert spool.size_bytes() == 150
    spool.remove(first)
    assert spool.size_bytes() == 50 == Spool(tmp_path).size_bytes()


def test_a_look_without_tidying_leaves_a_write_in_progress_alone(tmp_path: Path) -> None:
    (tmp_path / ".000000000001-1-0.gz.tmp").write_bytes(b"being written by the service")
    Spool(tmp_path, tidy=False)
    assert (tmp_path / ".000000000001-1-0.gz.tmp").exists()


def test_a_batch_set_aside_leaves_the_queue_but_stays_on_disk_across_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = spool.put(b"a" * 100)
    spool.put(b"b" * 50)
    moved = spool.set_aside(first)
    assert moved is not None and moved.path == tmp_path / "aside" / first.path.name
    again = Spool(tmp_path)
    assert [again.read(b) for b in again.pending()] == [b"b" * 50]
    assert [again.read(b) for b in again.aside()] == [b"a" * 100]
    assert again.size_bytes() == 150, "it still counts toward the size bound"
    assert again.put(b"c").seq == 3, "its sequence number is not given out again"
    [aside] = again.aside()
    again.remove(aside)
    assert again.aside() == [] and not aside.path.exists() and again.size_bytes() == 51
    assert spool.set_aside(first) is None, "already moved"


def test_the_age_bound_drops_set_aside_batches_too_and_counts_them(tmp_path: Path) -> None:
    clock = Clock()
    spool = Spool(tmp_path, max_age_s=3600, wall_clock=clock)
    old = spool.put(b"old", carried=2)
    spool.set_aside(old)
    clock.t += 1800
    spool.put(b"newer")
    clock.t += 1900
    oldest = spool.oldest()
    assert oldest is not None and spool.read(oldest) == b"newer"
    assert spool.aside() == [] and not list((tmp_path / "aside").iterdir())
    assert spool.take_dropped() == 3


def test_the_size_bound_drops_the_oldest_batch_whether_set_aside_or_queued(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=250)
    spool.put(b"q" * 100)
    spool.set_aside(spool.put(b"a" * 100))
    spool.put(b"n" * 100)
    assert [spool.read(b) for b in spool.pending()] == [b"n" * 100]
    assert [spool.read(b) for b in spool.aside()] == [b"a" * 100]
    spool.put(b"m" * 100)
    assert spool.aside() == [] and spool.take_dropped() == 2


def test_events_left_by_the_sender_wait_on_disk_until_discarded(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in range(3):
        spool.add_event({"ts": "2027-01-01T00:00:00Z", "kind": "batch_set_aside", "details": {"n": n}})
    again = Spool(tmp_path)
    assert [e["details"]["n"] for e in again.events()] == [0, 1, 2]
    again.discard_events(2)
    assert [e["details"]["n"] for e in Spool(tmp_path).events()] == [2]
    again.discard_events(1)
    assert again.events() == [] and not (tmp_path / "events.json").exists()


def test_dumps_puts_in_values_given_as_json_and_writes_the_same_text() -> None:
    document = {"a": 1.5, "b": ["é", {"c": None}], "h": [{"id": 0, "pid": 1}], "z": "\n"}
    plain = json.dumps(document, separators=(",", ":"))
    assert dumps(document) == plain
    assert dumps(document, {"h": '[{"id":0,"pid":1}]'}) == plain
    assert dumps(document, {"h": "[]"}) == plain.replace('[{"id":0,"pid":1}]', "[]")
