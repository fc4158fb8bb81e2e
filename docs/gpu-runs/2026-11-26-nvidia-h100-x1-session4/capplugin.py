"""Device check only: the cuda-32gb profile capped lower, so GPT-1.3B fp32 at world size 1 runs out of memory."""

from dataclasses import replace

from perfsuite.profiles import BUILTIN_PROFILES


def pytest_perfsuite_profiles():
    return [replace(BUILTIN_PROFILES["cuda-32gb"], device_memory_cap_mib=20 * 1024)]
