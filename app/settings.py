"""Server settings: one typed object, read from `GPUFLEET_*` environment variables."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def default_data_dir() -> Path:
    """Where the embedded PostgreSQL keeps its files unless `GPUFLEET_DATA_DIR` says otherwise."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufleet"


class Settings(BaseSettings):
    """Every setting of the server; `docs/configuration.md` lists them with their defaults."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL (postgresql://user:pass@host:5432/db). Unset: run an embedded server.",
    )
    data_dir: Path = Field(default_factory=default_data_dir, description="Embedded PostgreSQL data folder.")

    @field_validator("data_dir")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    workers: int = Field(default=1, ge=1, le=64, description="Server worker processes.")
    access_log: bool = Field(default=False, description="Log every HTTP request (one line each).")

    raw_retention_days: int = Field(default=14, ge=1, description="Days of raw samples kept (whole days).")
    rollup_retention_days: int = Field(default=400, ge=1, description="Days of hourly and daily rollups kept.")
    partitions_ahead_days: int = Field(default=3, ge=1, le=60, description="Daily partitions made ahead.")
    maintenance_interval_s: float = Field(default=600.0, gt=0, description="Partition upkeep period, s.")

    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest ingest body, bytes, after gzip is undone."
    )
    max_future_skew_s: float = Field(
        default=300.0, ge=0, description="How far past the server clock a sample may start, s."
    )
    mem_held_mib: int = Field(
        default=256, ge=0, description="Memory used at or above this (MiB) counts as held in rollups."
    )
    db_pool_size: int = Field(default=10, ge=1)

    # Waste analysis: docs/waste.md explains each default.
    prices_file: Path | None = Field(
        default=None, description="TOML file of price overrides (docs/waste.md); unset: catalog prices only."
    )
    idle_util_pct: int = Field(
        default=5, description="Utilization under this (%) is no meaningful activity; one of 1, 5, 10, 25, 50."
    )
    idle_min_hours: float = Field(
        default=1.0, gt=0, description="A passthrough GPU is listed as idle once idle this long, hours."
    )
    underused_util_pct: float = Field(
        default=10.0, ge=0, le=100, description="A MIG slice averaging under this (%) over the window is under-used."
    )
    offline_after_s: float = Field(
        default=300.0, gt=0, description="An instance with no data for this long is offline, s."
    )
    gone_after_h: float = Field(
        default=24.0, gt=0, description="An instance offline this long is taken as terminated: no more offline hours."
    )

    refresh_s: int = Field(default=30, ge=1, le=3600, description="How often dashboard pages refresh their figures, s.")

    # Access control: docs/security.md explains each.
    auth: Literal["on", "off"] = Field(
        default="on", description="off: reading needs no credentials, for a demo on loopback only; ingest still does."
    )
    admin_password_hash: str | None = Field(
        default=None, description="scrypt hash of a dashboard admin password (`gpufleet hash-password`); unset: none."
    )
    session_hours: float = Field(default=12.0, gt=0, le=720, description="How long a dashboard login lasts, hours.")
    cookie_secure: Literal["auto", "on", "off"] = Field(
        default="auto", description="Secure flag of the session cookie; auto: unless plain HTTP from loopback."
    )
    trusted_proxies: Annotated[list[IPv4Network | IPv6Network], NoDecode] = Field(
        default_factory=list, description="Addresses (IPs or CIDRs, comma-separated) whose user header is trusted."
    )
    proxy_user_header: str = Field(
        default="X-Forwarded-User", description="Header naming the user a trusted proxy has authenticated."
    )

    @field_validator("auth", "cookie_secure", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("admin_password_hash")
    @classmethod
    def _password_hash(cls, value: str | None) -> str | None:
        from .passwords import parse_hash

        if value is None or not value.strip():
            return None
        parse_hash(value)
        return value.strip()

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        try:
            return [ip_network(str(item).strip(), strict=False) for item in items if str(item).strip()]
        except ValueError as exc:
            raise ValueError(f"not an IP address or CIDR: {exc}") from None

    @field_validator("proxy_user_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", value.strip()):
            raise ValueError("a header name is letters, digits and dashes")
        return value.strip()

    @field_validator("idle_util_pct")
    @classmethod
    def _known_bound(cls, value: int) -> int:
        from .models import UTIL_BOUNDS

        if value not in UTIL_BOUNDS:
            raise ValueError(f"must be one of {', '.join(map(str, UTIL_BOUNDS))} (the rollup histogram's bounds)")
        return value

    @field_validator("prices_file")
    @classmethod
    def _expand_prices(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
