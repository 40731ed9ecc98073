"""Collection: NVML figures for every GPU and MIG slice, one interval at a time."""

from .collector import Collector
from .model import Denied, GpuInfo, Interval, Reading, SliceInfo

__all__ = ["Collector", "Denied", "GpuInfo", "Interval", "Reading", "SliceInfo"]
