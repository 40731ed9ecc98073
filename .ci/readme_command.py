"""Print one of the README's two commands, so CI runs exactly what a newcomer reads.

The commands are the first two ```sh blocks of README.md: `run` is the first, `test` the second.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

blocks = re.findall(r"```sh\n(.*?)```", (Path(__file__).parent.parent / "README.md").read_text(), re.S)
which = {"run": 0, "test": 1}[sys.argv[1]]
print(" && ".join(line.strip() for line in blocks[which].strip().splitlines() if line.strip()))
