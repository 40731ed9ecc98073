"""Host identity: EC2 instance metadata (IMDSv2) or the agent's settings, plus spot / rebalance notices."""

from __future__ import annotations

from .identity import Identity, IdentityResolver, IdentityUnavailable
from .imds import ImdsClient, ImdsUnavailable

__all__ = ["Identity", "IdentityResolver", "IdentityUnavailable", "ImdsClient", "ImdsUnavailable"]
