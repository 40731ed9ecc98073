from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.settings import Settings

from .live_server import LiveServer


@pytest.fixture
def live_server(settings: Settings, engine: object) -> Iterator[LiveServer]:
    """A running server on 127.0.0.1; tables are emptied after the test (the `engine` fixture)."""
    with LiveServer(settings) as server:
        yield server
