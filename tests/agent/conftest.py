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


def _nvidia_driver_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not _nvidia_driver_present():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU and driver (NVML did not initialise)")
        for item in gpu_tests:
            item.add_marker(skip)
