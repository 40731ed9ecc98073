"""Alembic, driven from code: `gpufleet migrate`, the embedded start-up and the tests all come through here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

import migrations

from .db import sqlalchemy_url

MIGRATIONS_DIR = Path(migrations.__file__).parent

# Partitions are made at run time by app.store.partitions; they are not part of the declared schema.
PARTITION_NAME = re.compile(r"^(samples|rollups_hourly|rollups_5m|holder_rollups_hourly|holder_groups_hourly)_p\d+")


def include_name(name: str | None, type_: str, _parent: Any) -> bool:
    """Autogenerate filter: partitions (and their indexes) are not part of the declared schema."""
    return not (type_ == "table" and name is not None and PARTITION_NAME.match(name))


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would choke on a % in a password.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    return script.get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
