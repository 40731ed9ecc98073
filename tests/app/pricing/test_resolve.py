"""Pricer: every branch of the resolution order in docs/waste.md, "Prices"."""

from __future__ import annotations

import pytest

from app.pricing import InstanceType, Price, PriceConfig, Pricer, TypePrice

P4D = 21.957642  # p4d.24xlarge, us-east-1 on-demand, USD/h


def price(
    pricer: Pricer,
    instance_type: str | None,
    lifecycle: str | None = "on-demand",
    agent: float | None = None,
    gpus_seen: int = 0,
) -> Price:
    return pricer.price(instance_type=instance_type, lifecycle=lifecycle, agent_usd_per_hour=agent, gpus_seen=gpus_seen)


FULL = PriceConfig(
    enterprise_discount_pct=8,
    spot_discount_pct=62,
    on_prem_usd_per_gpu_hour=1.9,
    instance_types={
        "p5e.48xlarge": TypePrice(usd_per_hour=68.0),
        "p4d.24xlarge": TypePrice(spot_usd_per_hour=9.5),
        "g7.custom": TypePrice(usd_per_hour=3.0, gpus=1),
        "g5.12xlarge": TypePrice(gpus=2),
        "x9.big": TypePrice(gpus=2),
    },
)


def test_catalog_on_demand_known_answer() -> None:
    p = price(Pricer(), "p4d.24xlarge")
    assert (p.usd_per_instance_hour, p.gpus, p.source) == (P4D, 8, "catalog on-demand")
    assert p.usd_per_gpu_hour == pytest.approx(2.74470525)
    assert p.known


def test_no_lifecycle_is_on_demand() -> None:
    assert price(Pricer(), "p4d.24xlarge", lifecycle=None).source == "catalog on-demand"


def test_no_list_price_is_no_price() -> None:
    p = price(Pricer(), "p5e.48xlarge")
    assert p.usd_per_gpu_hour is None and p.usd_per_instance_hour is None and not p.known
    assert p.gpus == 8
    assert p.source == "no price: p5e.48xlarge has no list price"
    # spot does not invent one either, discount or not
    assert price(Pricer(PriceConfig(spot_discount_pct=60)), "p5e.48xlarge", "spot").source == p.source


def test_enterprise_discount_applies_to_catalog_prices() -> None:
    p = price(Pricer(PriceConfig(enterprise_discount_pct=8)), "p4d.24xlarge")
    assert p.usd_per_instance_hour == pytest.approx(P4D * 0.92)
    assert p.usd_per_gpu_hour == pytest.approx(P4D * 0.92 / 8)
    assert p.source == "catalog on-demand - 8% enterprise"
    assert price(Pricer(PriceConfig(enterprise_discount_pct=7.5)), "g5.xlarge").source == (
        "catalog on-demand - 7.5% enterprise"
    )


def test_config_price_replaces_catalog_without_enterprise_discount() -> None:
    p = price(Pricer(FULL), "p5e.48xlarge")
    assert p.usd_per_instance_hour == 68.0 and p.gpus == 8 and p.usd_per_gpu_hour == 8.5
    assert p.source == "config p5e.48xlarge"


def test_config_price_beats_agent_price() -> None:
    assert price(Pricer(FULL), "p5e.48xlarge", agent=50.0).source == "config p5e.48xlarge"


def test_agent_price_beats_catalog() -> None:
    p = price(Pricer(PriceConfig(enterprise_discount_pct=8)), "p4d.24xlarge", agent=16.0)
    assert p == Price(16.0, 8, 2.0, "agent")


def test_agent_price_for_a_type_nobody_knows_uses_gpus_seen() -> None:
    assert price(Pricer(), "z1.odd", agent=9.0, gpus_seen=3) == Price(9.0, 3, 3.0, "agent")


def test_agent_price_zero_is_a_price() -> None:
    p = price(Pricer(), "g5.xlarge", agent=0.0)
    assert p.known and p.usd_per_gpu_hour == 0.0


def test_spot_config_price() -> None:
    p = price(Pricer(FULL), "p4d.24xlarge", "spot")
    assert p == Price(9.5, 8, 9.5 / 8, "config spot price")
    # an on-demand p4d is not affected by the spot price
    assert price(Pricer(FULL), "p4d.24xlarge").source == "catalog on-demand - 8% enterprise"


def test_spot_discount_on_catalog_price() -> None:
    p = price(Pricer(PriceConfig(spot_discount_pct=62)), "p4d.24xlarge", "spot")
    assert p.usd_per_instance_hour == pytest.approx(P4D * 0.38)
    assert p.usd_per_gpu_hour == pytest.approx(2.74470525 * 0.38)
    assert p.source == "catalog on-demand - 62% spot"


def test_spot_discount_stacks_on_the_on_demand_base() -> None:
    p = price(Pricer(FULL), "g5.xlarge", "spot")
    assert p.usd_per_instance_hour == pytest.approx(1.006 * 0.92 * 0.38)
    assert p.source == "catalog on-demand - 8% enterprise - 62% spot"
    p = price(Pricer(FULL), "p5e.48xlarge", "spot")
    assert p.usd_per_instance_hour == pytest.approx(68.0 * 0.38)
    assert p.source == "config p5e.48xlarge - 62% spot"
    # The agent's price is what that host costs: no spot discount on top of it.
    p = price(Pricer(FULL), "g5.xlarge", "spot", agent=2.0)
    assert (p.usd_per_instance_hour, p.source) == (2.0, "agent")


def test_spot_without_discount_is_on_demand_and_says_so() -> None:
    p = price(Pricer(), "p4d.24xlarge", "spot")
    assert p.usd_per_instance_hour == P4D and p.usd_per_gpu_hour == pytest.approx(2.74470525)
    assert p.source == "catalog on-demand (spot discount not set)"


def test_gpu_count_from_config_then_catalog_then_seen() -> None:
    pricer = Pricer(FULL)
    assert price(pricer, "g5.12xlarge", gpus_seen=4).gpus == 2  # config beats the catalog's 4
    assert price(pricer, "g5.48xlarge", gpus_seen=3).gpus == 8  # catalog beats what was seen
    assert price(pricer, "g7.custom", gpus_seen=4) == Price(3.0, 1, 3.0, "config g7.custom")
    assert (
        price(
            Pricer(PriceConfig(instance_types={"g7.custom": TypePrice(usd_per_hour=3.0)})), "g7.custom", gpus_seen=2
        ).usd_per_gpu_hour
        == 1.5
    )


def test_no_gpus_anywhere_is_no_price() -> None:
    config = PriceConfig(instance_types={"g7.custom": TypePrice(usd_per_hour=3.0)})
    p = price(Pricer(config), "g7.custom", gpus_seen=0)
    assert p.usd_per_instance_hour == 3.0 and p.gpus is None and p.usd_per_gpu_hour is None and not p.known
    assert p.source == "no price: no GPU count for g7.custom (none seen)"


def test_unknown_type_is_no_price() -> None:
    p = price(Pricer(FULL), "z1.odd", gpus_seen=4)
    assert p == Price(None, 4, None, "no price: z1.odd is not in the catalog")
    assert price(Pricer(FULL), "z1.odd", "spot", gpus_seen=4).source == p.source
    assert price(Pricer(FULL), "x9.big").source == (
        "no price: x9.big is not in the catalog and its config has no usd_per_hour"
    )


def test_on_prem_agent_price() -> None:
    p = price(Pricer(FULL), None, "on-prem", agent=18.5, gpus_seen=4)
    assert p == Price(18.5, 4, 4.625, "agent")


def test_on_prem_rate_times_gpus() -> None:
    p = price(Pricer(FULL), "dgx-a100", "on-prem", gpus_seen=8)
    assert p.usd_per_instance_hour == pytest.approx(15.2) and p.gpus == 8
    assert p.usd_per_gpu_hour == pytest.approx(1.9)
    assert p.source == "config on-prem $/GPU-h"


def test_on_prem_ignores_catalog_prices() -> None:
    p = price(Pricer(FULL), "p4d.24xlarge", "on-prem")
    assert p.gpus == 8 and p.usd_per_gpu_hour == pytest.approx(1.9) and p.source == "config on-prem $/GPU-h"
    assert price(Pricer(), "p4d.24xlarge", "on-prem").usd_per_gpu_hour is None


def test_on_prem_config_type_price() -> None:
    assert price(Pricer(FULL), "g7.custom", "on-prem", agent=5.0) == Price(3.0, 1, 3.0, "config g7.custom")


def test_no_instance_type_takes_the_on_prem_path() -> None:
    assert price(Pricer(FULL), None, "on-demand", gpus_seen=2).source == "config on-prem $/GPU-h"
    assert price(Pricer(FULL), "", None, agent=4.0, gpus_seen=2) == Price(4.0, 2, 2.0, "agent")


def test_on_prem_without_any_price() -> None:
    p = price(Pricer(), None, "on-prem", gpus_seen=4)
    assert p == Price(None, 4, None, "no price: on-prem host, no agent price and no on_prem_usd_per_gpu_hour")
    p = price(Pricer(), None, None, gpus_seen=4)
    assert p.source == "no price: host with no instance type, no agent price and no on_prem_usd_per_gpu_hour"
    p = price(Pricer(FULL), None, "on-prem", gpus_seen=0)
    assert not p.known and p.gpus is None and p.source.startswith("no price: on-prem host with no GPUs seen")


def test_custom_catalog() -> None:
    catalog = {"t1.tiny": InstanceType("t1.tiny", "Test GPU", None, 2, 8.0, 4, 1.0)}
    pricer = Pricer(catalog=catalog)
    assert price(pricer, "t1.tiny") == Price(1.0, 2, 0.5, "catalog on-demand")
    assert price(pricer, "p4d.24xlarge").source == "no price: p4d.24xlarge is not in the catalog"


def test_gpu_model() -> None:
    pricer = Pricer(FULL)
    assert pricer.gpu_model("p4d.24xlarge") == "NVIDIA A100 40GB"
    assert pricer.gpu_model("g7.custom") is None
    assert pricer.gpu_model(None) is None
