"""The embedded PostgreSQL (the `pgserver` package) used when no GPUFLEET_DATABASE_URL is given."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

DATABASE = "gpufleet"


class EmbeddedPostgres:
    """A PostgreSQL server private to this data folder, reached over a Unix socket only (no TCP port)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pgdata = data_dir / "pgdata"
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server, make sure the database exists, and return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._forget_dead_users()
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (systemd services, containers); harmless here.
            warnings.simplefilter("ignore")
            import pgserver  # imported here: only the embedded path needs it

            self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        admin_uri: str = self._server.get_uri()
        with psycopg.connect(admin_uri, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        socket_dir = admin_uri.split("host=", 1)[1]
        return f"postgresql://postgres@/{DATABASE}?host={quote(socket_dir, safe='/')}"

    def _forget_dead_users(self) -> None:
        """pgserver stops the server when its last user process leaves, counting users in a pid file. A user
        killed without cleanup (kill -9, power loss) stays listed and would keep the server up forever."""
        pid_file = self.pgdata / ".handle_pids.json"
        try:
            pids = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
        if alive != pids:
            pid_file.write_text(json.dumps(alive))

    def stop(self) -> None:
        """Stop the server unless another gpufleet process in this data folder still uses it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
