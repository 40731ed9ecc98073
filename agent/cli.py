"""`gpufleet-agent`: the per-host collector (placeholder until the agent lands)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("gpufleet-agent: not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
