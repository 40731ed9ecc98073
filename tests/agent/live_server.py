"""The real gpufleet server on a real TCP port, in a thread, that a test can stop and start again.

Agent tests post over HTTP exactly as in production; stopping the server (the port then refuses
connections) is how they make an outage.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from app.main import create_app
from app.settings import Settings


class LiveServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self._server is None
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        config = uvicorn.Config(create_app(self.settings), log_level="warning", lifespan="on", access_log=False)
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("live server did not start")
            time.sleep(0.02)
        self._server, self._thread, self._sock = server, thread, sock

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()
        self._server = self._thread = None

    def __enter__(self) -> LiveServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
