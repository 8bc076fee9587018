"""A stand-in for nvidia-ml-py's ``pynvml`` where no NVIDIA driver is (this machine, CI): the
functions ``launcher.backends.local.nvml`` calls, answering as the real ones do, from the JSON
file named by ``PODLAUNCH_TEST_NVML``::

    {"gpus": [{"minor": 4, "uuid": "GPU-...", "name": "NVIDIA H200",
               "total": 150485401600, "processes": [{"pid": 1234, "used": 32212254720}]}]}

Without that variable ``nvmlInit`` raises as the real one does on a machine without the
driver (``NVMLError_LibraryNotFound``, "NVML Shared Library Not Found"). Names, return types
and exceptions follow nvidia-ml-py 13.615 (``pynvml.py``): strings as ``str``, processes as
objects with ``pid`` and ``usedGpuMemory`` (bytes, or None when not available), memory info
with ``total``, ``free`` and ``used``.
"""

import json
import os
from types import SimpleNamespace

_state = {}


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value

    def __str__(self):
        return {12: "NVML Shared Library Not Found", 2: "Invalid Argument"}.get(self.value,
                                                                               "Unknown Error")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(12)


def nvmlInit():
    path = os.environ.get("PODLAUNCH_TEST_NVML")
    if not path:
        raise NVMLError_LibraryNotFound()
    with open(path) as f:
        _state["gpus"] = json.load(f)["gpus"]


def nvmlShutdown():
    _state.pop("gpus", None)


def nvmlDeviceGetCount():
    return len(_state["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < len(_state["gpus"]):
        raise NVMLError(2)
    return _state["gpus"][index]


def nvmlDeviceGetMinorNumber(handle):
    return handle["minor"]


def nvmlDeviceGetUUID(handle):
    return handle["uuid"]


def nvmlDeviceGetName(handle):
    return handle["name"]


def nvmlDeviceGetMemoryInfo(handle, version=None):
    used = sum(p.get("used") or 0 for p in handle.get("processes", ()))
    return SimpleNamespace(total=handle["total"], used=used, free=handle["total"] - used)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used"))
            for p in handle.get("processes", ())]
