from __future__ import annotations

import time
from typing import Any

import pynvml
import pytest

from agent import fake_nvml
from agent.nvml import Absent, Nvml, NvmlUnavailable, load_library, reason_of


def test_no_driver_is_one_readable_line() -> None:
    with pytest.raises(NvmlUnavailable, match=r"^NVML library not found: is the NVIDIA driver installed\?$"):
        Nvml.open(fake_nvml.load("no-driver"))


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
    ],
)
def test_startup_failures_say_what_to_do(error: int, words: str) -> None:
    lib = fake_nvml.load("p5")
    lib.fail("nvmlInit", error)
    with pytest.raises(NvmlUnavailable, match=words):
        Nvml.open(lib)


def test_a_hung_init_is_abandoned() -> None:
    class Hangs:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self) -> None:
            time.sleep(5)

    started = time.monotonic()
    with pytest.raises(NvmlUnavailable, match="did not initialise"):
        Nvml.open(Hangs(), timeout_s=0.2)
    assert time.monotonic() - started < 2


def test_call_turns_errors_into_absent_values_and_counts_them() -> None:
    nvml = Nvml.open(fake_nvml.load("p5"))
    handle = nvml.lib.nvmlDeviceGetHandleByIndex(0)
    nvml.lib.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
    value: Any = nvml.call(nvml.lib.nvmlDeviceGetPowerUsage, handle)
    assert value == Absent("not_supported") and not value
    assert nvml.quiet(nvml.lib.nvmlDeviceGetPowerUsage, handle) == Absent("not_supported")
    assert nvml.take_errors() == {"nvmlDeviceGetPowerUsage:not_supported": 1}
    assert nvml.take_errors() == {}
    nvml.close()


def test_reasons() -> None:
    assert reason_of(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu_lost"
    assert reason_of(pynvml.NVMLError(12345)) == "nvml_error_12345"
    assert reason_of(pynvml.NVMLLibraryMismatchError()) == "library_mismatch"


def test_unknown_scenarios_are_named() -> None:
    with pytest.raises(NvmlUnavailable, match=r"known: .*p4d-mig"):
        load_library("p9-imaginary")


def test_driver_and_cuda_versions() -> None:
    nvml = Nvml.open(fake_nvml.load("p5"))
    assert nvml.driver_version() == "550.127.05" and nvml.cuda_version() == "12.4"
