"""Pricing: the EC2 GPU catalog, the operator's price file, and the price per GPU-hour of an instance."""

from __future__ import annotations

from .catalog import InstanceType, MigProfile, load_catalog, mig_profiles
from .config import PriceConfig, PriceConfigError, TypePrice, load_price_config
from .resolve import Price, Pricer

__all__ = [
    "InstanceType",
    "MigProfile",
    "Price",
    "PriceConfig",
    "PriceConfigError",
    "Pricer",
    "TypePrice",
    "load_catalog",
    "load_price_config",
    "mig_profiles",
]
