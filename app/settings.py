"""Server settings: one typed object, read from `GPUFLEET_*` environment variables."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PARSED_BYTES_PER_JSON_BYTE = 16
"""Memory a parsed ingest batch takes per byte of its JSON, rounded up: a batch of samples is many small
objects (measured: 2.9 MiB of JSON became 41 MiB of models)."""


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
    db_pool_timeout_s: float = Field(
        default=10.0, gt=0, description="How long a request waits for a free database connection, s; then 503."
    )

    # Ingest admission and load shedding: docs/ingest-protocol.md, "Limits and load shedding".
    ingest_memory_budget_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="Memory all ingest requests of a worker may hold at once, bytes: the body as received, its "
        f"JSON after gzip is undone, {PARSED_BYTES_PER_JSON_BYTE} times that JSON for the parsed batch; past it: 503.",
    )
    ingest_max_storing: int | None = Field(
        default=None, ge=1, description="Batches one worker parses and stores at once; unset: GPUFLEET_DB_POOL_SIZE."
    )
    ingest_max_parsing: int = Field(default=2, ge=1, description="Batches one worker decodes and parses at once.")
    ingest_slot_wait_s: float = Field(
        default=2.0, ge=0, le=60, description="Longest wait for a free slot before a batch is refused with 503, s."
    )
    ingest_retry_after_s: int = Field(default=5, ge=1, le=3600, description="Retry-After of a shed request, s.")
    ingest_token_cache_s: float = Field(
        default=5.0, ge=0, le=300, description="How long a token lookup is reused before the body is read, s."
    )

    @model_validator(mode="after")
    def _budget_holds_one_body(self) -> Settings:
        # A budget that cannot hold the largest allowed body refuses it for ever, and an agent would send it
        # again without end.
        need = (2 + PARSED_BYTES_PER_JSON_BYTE) * self.max_body_bytes
        if self.ingest_memory_budget_bytes < need:
            raise ValueError(
                f"GPUFLEET_INGEST_MEMORY_BUDGET_BYTES must be at least {2 + PARSED_BYTES_PER_JSON_BYTE} times "
                f"GPUFLEET_MAX_BODY_BYTES ({need})"
            )
        return self

    @property
    def ingest_store_slots(self) -> int:
        return self.ingest_max_storing or self.db_pool_size

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

    # Billing: docs/billing.md.
    billing_source: str | None = Field(
        default=None,
        description="CUR 2.0 export the server imports on a schedule: a folder or s3://BUCKET/PREFIX; unset: none "
        "(`gpufleet billing import` still works).",
    )
    billing_import_interval_s: float = Field(
        default=21600.0, ge=60, description="How often the server imports GPUFLEET_BILLING_SOURCE, s."
    )
    spot_prices: Literal["on", "off"] = Field(
        default="off",
        description="on: read EC2 spot price history for the fleet's spot instances (AWS credentials needed).",
    )
    spot_prices_check_s: float = Field(
        default=600.0, ge=10, description="How often the server looks for spot price history due a read, s."
    )

    # Alerts: docs/alerts.md.
    alerts_file: Path | None = Field(
        default=None,
        description="TOML file of alert rules loaded at start (configuration as code); unset: rules from the "
        "/alerts page and the API only. A file with an error stops `gpufleet serve` with one line.",
    )
    alerts: Literal["on", "off"] = Field(
        default="on",
        description="off: this server evaluates no rules and sends no alert messages, stop actions or digests; "
        "rules, incidents and the outbox stay for a server with alerts on to act on.",
    )
    alerts_check_s: float = Field(default=60.0, ge=5, le=3600, description="How often rules are evaluated, s.")
    alerts_send_s: float = Field(default=5.0, gt=0, le=300, description="How often due messages are sent, s.")
    alerts_digest_hour: int = Field(
        default=8, ge=0, le=23, description="UTC hour from which each route's daily digest of the last day is sent."
    )
    public_url: str | None = Field(
        default=None,
        description="The dashboard's address as recipients reach it, for the links in messages; unset: the "
        "address `serve` binds.",
    )
    alerts_signing_key: str | None = Field(
        default=None,
        description="Key that signs snooze links; unset: one made at first start and kept in the database.",
    )
    owner_tags: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["Owner", "owner", "email"],
        description="Instance tags naming who owns an instance, tried in order (comma-separated).",
    )
    user_emails: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Addresses of the users processes run as: user=address pairs, comma-separated.",
    )
    team_tag: str = Field(
        default="team",
        min_length=1,
        max_length=128,
        description="Instance tag naming the team an instance belongs to, for owner routes without an owner.",
    )
    team_routes: Annotated[dict[str, list[str]], NoDecode] = Field(
        default_factory=dict,
        description="Where each team's alerts go: team=address or team=Slack incoming webhook URL pairs, "
        "comma-separated; a team given twice has both.",
    )
    smtp_host: str | None = Field(default=None, description="SMTP server for email routes; unset: no email.")
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_starttls: Literal["on", "off"] = Field(default="on", description="on: STARTTLS before anything is sent.")
    smtp_user: str | None = Field(default=None, description="SMTP login; unset: no AUTH.")
    smtp_password: str | None = None
    smtp_from: str = Field(default="gpufleet@localhost", description="From address of alert email.")

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        from urllib.parse import urlsplit

        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"expected http(s)://host[:port][/path], not {value.strip()[:80]!r}")
        return value.strip().rstrip("/")

    @field_validator("alerts_signing_key")
    @classmethod
    def _signing_key(cls, value: str | None) -> str | None:
        # A short key could be guessed, and with it snooze links forged for any incident.
        if value is None or not value.strip():
            return None
        if len(value.strip()) < 32:
            raise ValueError("must be 32 characters or more, such as the output of `openssl rand -hex 32`")
        return value.strip()

    @field_validator("owner_tags", mode="before")
    @classmethod
    def _tag_list(cls, value: object) -> object:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        return [str(item).strip() for item in items if str(item).strip()]

    @field_validator("user_emails", mode="before")
    @classmethod
    def _user_emails(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        out: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in value.split(","))):
            user, sep, address = pair.partition("=")
            if not sep or not user.strip() or "@" not in address:
                raise ValueError(f"expected user=address, not {pair[:60]!r}")
            out[user.strip()] = address.strip()
        return out

    @field_validator("team_tag", mode="before")
    @classmethod
    def _strip_tag(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) else value

    @field_validator("team_routes", mode="before")
    @classmethod
    def _team_pairs(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        out: dict[str, list[str]] = {}
        for pair in filter(None, (p.strip() for p in value.split(","))):
            # A pair may hold a Slack URL, whose path is a secret: errors name the team, never the target.
            team, sep, target = (part.strip() for part in pair.partition("="))
            if not sep or not team:
                raise ValueError("expected team=address or team=https://hooks.slack.com/... pairs, comma-separated")
            if not target:
                raise ValueError(f"team {team[:40]!r} has no address or Slack URL after '='")
            out.setdefault(team, []).append(target)
        return out

    @field_validator("team_routes")
    @classmethod
    def _team_targets(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        from .alerts.recipients import team_target

        for team, targets in value.items():
            for target in targets:
                team_target(team, target)  # ValueError naming the team
        return value

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
    # Signed EC2 instance identity at ingest: docs/ingest-protocol.md, "Authentication".
    identity_accounts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="AWS account ids (comma-separated) whose signed instance identity may post batches; "
        "empty: identity is not accepted.",
    )
    identity_extra_certs: Path | None = Field(
        default=None,
        description="PEM file of certificates trusted beside AWS's for instance identity signatures (tests, demo).",
    )

    @field_validator("identity_accounts", mode="before")
    @classmethod
    def _accounts(cls, value: object) -> object:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        accounts = [str(item).strip() for item in items if str(item).strip()]
        for account in accounts:
            if not re.fullmatch(r"\d{12}", account):
                raise ValueError(f"an AWS account id is 12 digits, not {account[:20]!r}")
        return accounts

    @field_validator("identity_extra_certs")
    @classmethod
    def _extra_certs(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        from .ingest.identity import load_certificates

        load_certificates(value.expanduser())  # a file that does not load stops the server at start
        return value.expanduser()

    @field_validator("auth", "alerts", "cookie_secure", "smtp_starttls", mode="before")
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

    @field_validator("prices_file", "alerts_file")
    @classmethod
    def _expand_prices(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
