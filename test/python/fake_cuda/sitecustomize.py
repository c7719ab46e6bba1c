"""Installs the fake CUDA driver of `fake_driver.py` in every Python process
started with this folder on PYTHONPATH and ETC_FAKE_CUDA_MAP set (a JSON
file mapping the SHA-256 of each PTX module to the CPU artifact of the same
program), so that the GPU kit's child processes get it too; with
ETC_FAKE_NVSHMEM set, also the fake `nvshmem.bindings` of `fake_nvshmem.py`
(the kit's ranks, started by mpiexec)."""

import os

if os.environ.get("ETC_FAKE_CUDA_MAP"):
    import fake_driver

    fake_driver.from_environment()
if os.environ.get("ETC_FAKE_NVSHMEM"):
    import fake_nvshmem

    fake_nvshmem.install()
