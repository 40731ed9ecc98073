"""From an instance to a price per GPU-hour, with where that price came from (docs/waste.md, "Prices")."""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import InstanceType, load_catalog
from .config import PriceConfig, TypePrice


@dataclass(frozen=True)
class Price:
    """What one instance costs: USD/h for the whole instance and USD per GPU-hour.

    `usd_per_gpu_hour` None means no price (never 0 for unknown); `source` says where the figure came from,
    or, when there is none, why.
    """

    usd_per_instance_hour: float | None
    gpus: int | None
    usd_per_gpu_hour: float | None
    source: str

    @property
    def kind(self) -> str | None:
        """Where the price came from, in one word of docs/billing.md's order: "agent", "price file" or
        "catalog" (the bill and spot history price hours, app/billing/prices.py); None without a price."""
        if self.usd_per_gpu_hour is None:
            return None
        if self.source == "agent":
            return "agent"
        return "price file" if self.source.startswith("config") else "catalog"

    @property
    def known(self) -> bool:
        """Whether there is a price per GPU-hour."""
        return self.usd_per_gpu_hour is not None


def _pct(value: float) -> str:
    return f"{value:g}%"


class Pricer:
    """Prices instances from the catalog and a price config; cheap to call once per instance."""

    def __init__(self, config: PriceConfig | None = None, catalog: dict[str, InstanceType] | None = None) -> None:
        self.config = config if config is not None else PriceConfig()
        self.catalog = catalog if catalog is not None else load_catalog()

    def gpu_model(self, instance_type: str | None) -> str | None:
        """The catalog's GPU model for the type (e.g. "NVIDIA A100 40GB"), None for types it lacks."""
        entry = self.catalog.get(instance_type) if instance_type else None
        return entry.gpu_model if entry is not None else None

    def price(
        self, *, instance_type: str | None, lifecycle: str | None, agent_usd_per_hour: float | None, gpus_seen: int
    ) -> Price:
        """The price of one instance. `agent_usd_per_hour` is what its agent sent (whole instance, USD/h);
        `gpus_seen` how many GPUs it reported, used only when neither config nor catalog knows the type."""
        override = self.config.instance_types.get(instance_type) if instance_type else None
        entry = self.catalog.get(instance_type) if instance_type else None
        gpus = self._gpus(override, entry, gpus_seen)

        if lifecycle == "on-prem" or not instance_type:
            usd, source = self._off_ec2(lifecycle, override, instance_type, agent_usd_per_hour, gpus)
        else:
            usd, source = self._on_demand(instance_type, override, entry, agent_usd_per_hour)
            if lifecycle == "spot":
                usd, source = self._spot(override, usd, source)

        if usd is None:
            return Price(None, gpus, None, source)
        if gpus is None:
            what = instance_type or "this host"
            return Price(usd, None, None, f"no price: no GPU count for {what} (none seen)")
        return Price(usd, gpus, usd / gpus, source)

    def _gpus(self, override: TypePrice | None, entry: InstanceType | None, gpus_seen: int) -> int | None:
        if override is not None and override.gpus is not None:
            return override.gpus
        if entry is not None:
            return entry.gpu_count
        return gpus_seen if gpus_seen > 0 else None

    def _on_demand(
        self, instance_type: str, override: TypePrice | None, entry: InstanceType | None, agent: float | None
    ) -> tuple[float | None, str]:
        # The operator's own figure for the type is a real price: no enterprise discount on top.
        if override is not None and override.usd_per_hour is not None:
            return override.usd_per_hour, f"config {instance_type}"
        if agent is not None:
            return agent, "agent"
        if entry is None and override is not None:
            return None, f"no price: {instance_type} is not in the catalog and its config has no usd_per_hour"
        if entry is None:
            return None, f"no price: {instance_type} is not in the catalog"
        if entry.on_demand_usd_per_hour is None:
            return None, f"no price: {instance_type} has no list price"
        pct = self.config.enterprise_discount_pct
        if pct:
            return entry.on_demand_usd_per_hour * (1 - pct / 100), f"catalog on-demand - {_pct(pct)} enterprise"
        return entry.on_demand_usd_per_hour, "catalog on-demand"

    def _spot(self, override: TypePrice | None, base: float | None, source: str) -> tuple[float | None, str]:
        if override is not None and override.spot_usd_per_hour is not None:
            return override.spot_usd_per_hour, "config spot price"
        if base is None or source == "agent":
            # The agent's figure is what that host really costs (docs/ingest-protocol.md): no discount on top.
            return base, source
        pct = self.config.spot_discount_pct
        if pct is None:
            # On-demand overstates what spot costs; the source says so rather than guessing a discount.
            return base, f"{source} (spot discount not set)"
        return base * (1 - pct / 100), f"{source} - {_pct(pct)} spot"

    def _off_ec2(
        self,
        lifecycle: str | None,
        override: TypePrice | None,
        instance_type: str | None,
        agent: float | None,
        gpus: int | None,
    ) -> tuple[float | None, str]:
        # EC2 list prices say nothing about hardware the company owns.
        if override is not None and override.usd_per_hour is not None:
            return override.usd_per_hour, f"config {instance_type}"
        if agent is not None:
            return agent, "agent"
        rate = self.config.on_prem_usd_per_gpu_hour
        what = "on-prem host" if lifecycle == "on-prem" else "host with no instance type"
        if rate is None:
            return None, f"no price: {what}, no agent price and no on_prem_usd_per_gpu_hour"
        if gpus is None:
            return None, f"no price: {what} with no GPUs seen for the on-prem $/GPU-h"
        return rate * gpus, "config on-prem $/GPU-h"
