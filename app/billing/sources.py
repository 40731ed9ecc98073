"""Where CUR 2.0 files come from: a local folder, searched for *.parquet, or an S3 prefix read with boto3 and the
standard credential chain (environment, shared config, instance role; AWS_ENDPOINT_URL points it elsewhere).

AWS Data Exports delivers a billing period's files under <prefix>/<export>/data/BILLING_PERIOD=YYYY-MM/: in place
when it overwrites, in a new folder per delivery (named after the delivery time) when it creates new files
("Understanding export delivery", https://docs.aws.amazon.com/cur/latest/userguide/dataexports-export-delivery.html).
Of each billing period only the newest delivery is read.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PARTITION = re.compile(r"^BILLING_PERIOD=\d{4}-\d{2}$", re.IGNORECASE)


class SourceError(Exception):
    """A source that cannot be read. `str()` is one line: the source, then the problem."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


@dataclass(frozen=True)
class CurFile:
    """One data file, on local disk at `path`; `source` is how it is named to people (its path or s3:// URI),
    `delivery` the folder it was delivered in, `bytes` its size."""

    source: str
    path: Path
    sha256: str
    bytes: int
    delivery: str


@dataclass(frozen=True)
class Listed:
    """A data file found under a source, before it is fetched."""

    source: str  # path or s3:// URI
    key: str  # position under the source, "/"-separated
    modified: float  # POSIX seconds


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def newest_deliveries(listed: list[Listed]) -> list[Listed]:
    """Of each BILLING_PERIOD=YYYY-MM folder, the files of its newest delivery: the folder holding the most recently
    written file (on a tie, the last by name: delivery folders are named after their time). Files outside such a
    folder are all kept."""
    by_partition: dict[str, dict[str, list[Listed]]] = defaultdict(lambda: defaultdict(list))
    kept: list[Listed] = []
    for item in listed:
        parts = PurePosixPath(item.key).parts
        at = next((i for i, part in enumerate(parts[:-1]) if PARTITION.match(part)), None)
        if at is None:
            kept.append(item)
        else:
            by_partition["/".join(parts[: at + 1])]["/".join(parts[:-1])].append(item)
    for deliveries in by_partition.values():
        newest = max(deliveries, key=lambda folder: (max(i.modified for i in deliveries[folder]), folder))
        kept.extend(deliveries[newest])
    return sorted(kept, key=lambda i: i.key)


def _delivery(key: str) -> str:
    return str(PurePosixPath(key).parent)


def _local(folder: Path) -> list[CurFile]:
    if not folder.exists():
        raise SourceError(str(folder), "no such file or folder")
    if folder.is_file():
        return [CurFile(str(folder), folder, sha256_of(folder), folder.stat().st_size, str(folder.parent))]
    paths = sorted(p for p in folder.rglob("*.parquet") if p.is_file())
    listed = [Listed(str(p), p.relative_to(folder).as_posix(), p.stat().st_mtime) for p in paths]
    return [
        CurFile(item.source, Path(item.source), sha256_of(Path(item.source)), Path(item.source).stat().st_size,
                _delivery(item.key))
        for item in newest_deliveries(listed)
    ]  # fmt: skip


def _split_s3(source: str) -> tuple[str, str]:
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    if not bucket:
        raise SourceError(source, "no bucket: give s3://BUCKET/PREFIX")
    return bucket, (prefix.rstrip("/") + "/" if prefix.strip("/") else "")


def _s3(source: str, workdir: Path) -> list[CurFile]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = _split_s3(source)
    try:
        s3 = boto3.client("s3")
        listed: list[Listed] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith(".parquet"):
                    uri = f"s3://{bucket}/{key}"
                    listed.append(Listed(uri, key[len(prefix) :], obj["LastModified"].timestamp()))
        files = []
        for n, item in enumerate(newest_deliveries(listed)):
            local = workdir / f"{n:05d}.parquet"
            s3.download_file(bucket, prefix + item.key, str(local))
            files.append(CurFile(item.source, local, sha256_of(local), local.stat().st_size, _delivery(item.key)))
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise SourceError(source, f"{error.get('Code', 'error')}: {error.get('Message', str(exc))}") from exc
    except BotoCoreError as exc:
        raise SourceError(source, str(exc).splitlines()[0]) from exc
    return files


@contextmanager
def cur_files(source: str) -> Iterator[list[CurFile]]:
    """The newest delivery's data files of each billing period under `source` (a folder, a file, or
    s3://bucket/prefix), on local disk for the duration of the block. SourceError if it cannot be read or has
    none."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-cur-") as tmp:
        try:
            files = _s3(source, Path(tmp)) if source.startswith("s3://") else _local(Path(source).expanduser())
        except OSError as exc:  # unreadable, or no room left for the downloads
            raise SourceError(source, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from exc
        if not files:
            raise SourceError(source, "no Parquet files (*.parquet) found")
        yield files


__all__ = ["CurFile", "Listed", "SourceError", "cur_files", "newest_deliveries", "sha256_of"]
