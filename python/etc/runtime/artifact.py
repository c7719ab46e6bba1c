"""Saved kernels: one self-describing file that runs without MLIR.

An artifact is a zip archive (stored, not compressed, so that it can be read
with any zip tool) holding:

* `etc-artifact.json`: the format name and version, the target, the chip,
  the schedule, the kernel ABI (`KernelABI`: arguments in order with names,
  kinds, dtypes and symbolic shapes, outputs, task and event tables), the
  SHA-256 of the code, the saver's `metadata` (a JSON object, e.g. what
  `etc.models` compiled the kernel from), and a SHA-256 of the manifest
  itself (an edited ABI would make the code read past its arrays);
* the code: `kernel.ptx` (PTX text) for CUDA, or `kernel.so` for the CPU (a
  shared library linked from the lowered LLVM module by the system C
  compiler, for the `platform` the manifest names and the x86-64 level
  `isa` it records, `etc.runtime.isa`);
* for a CUDA program on several ranks, `nvshmem.ptx`: NVSHMEM's device
  library for the chip as PTX (the manifest's `library` entry has its
  SHA-256), which the runtime links with the kernel's PTX at load
  (`etc.runtime.nvshmem`).

`load(path)` checks all of that, and that this machine's CPU has the
features of the recorded level, and returns a `LoadedKernel`: the same `run`
as a freshly compiled kernel, plus `arguments`, `abi` and, for CUDA, `ptx`.
A file that is not an artifact, is damaged, has another format version, or
holds CPU code this machine cannot run raises `ArtifactError` saying which.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import struct
import tempfile
import zipfile
from pathlib import Path

from .abi import KernelABI
from .kernel import Kernel

#: The `format` field of every artifact manifest.
FORMAT = "etc-artifact"
#: The version of the layout this runtime reads and writes. Bump it whenever
#: the manifest, the ABI or the meaning of the code's entry points changes
#: (e.g. the counter-buffer layout the runtime decodes). 2: the run header's
#: CPU words for blocking waits (sleepers, spin budget). 3: the CPU code's
#: instruction-set level, and the manifest's digest of itself.
#: 4: CUDA workers take their tile scratch as dynamic shared memory
#: (`KernelABI.shared_bytes`), which an older runtime would not give them.
#: 5: CPU code has the worker pool's entry points (`<g>_worker_packed`,
#: `<g>_park`, `<g>_launch`), which the runtime's threads wait in.
#: 6: the ABI records the CUDA worker's threads per CTA (`KernelABI.lanes`),
#: which an older runtime would launch as 128.
FORMAT_VERSION = 6
#: The versions this runtime loads: 5 differs from 6 only in having no
#: `lanes`, which then reads as 128 (what every kernel was compiled for).
READ_VERSIONS = (5, 6)
MANIFEST = "etc-artifact.json"
_CODE = {"cuda": "kernel.ptx", "cpu": "kernel.so"}


class ArtifactError(ValueError):
    """A file that this runtime cannot load as an ETC artifact, and why."""


def host_platform() -> str:
    """The platform a CPU artifact built here runs on, e.g. "linux-x86_64"."""
    return f"{platform.system().lower()}-{platform.machine().lower()}"


#: The member holding NVSHMEM's device library of a CUDA program on ranks.
LIBRARY = "nvshmem.ptx"


def write(path, abi: KernelABI, code: bytes, metadata: dict | None = None, *,
          library: bytes | None = None) -> None:
    """Writes an artifact of `abi` with `code` (PTX text or a shared library),
    `metadata` (JSON-able) and, for a CUDA program on several ranks,
    `library` (NVSHMEM's device library as PTX) to `path`."""
    ranks = abi.extra.get("ranks", 1) > 1
    if abi.target == "cuda" and ranks and library is None:
        raise ValueError(f"{abi.name} runs on several GPUs: its artifact needs NVSHMEM's device "
                         "library (library=)")
    if abi.target not in _CODE:
        raise ValueError(f"cannot save a kernel for target {abi.target!r}")
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "target": abi.target,
        "chip": abi.chip,
        "schedule": abi.schedule,
        "platform": host_platform() if abi.target == "cpu" else None,
        "code": {"name": _CODE[abi.target], "sha256": hashlib.sha256(code).hexdigest(),
                 "bytes": len(code)},
        "isa": abi.isa,
        "abi": abi.to_json(),
        "metadata": dict(metadata or {}),
    }
    if library is not None:
        manifest["library"] = {"name": LIBRARY, "sha256": hashlib.sha256(library).hexdigest(),
                               "bytes": len(library)}
    manifest["sha256"] = _manifest_digest(manifest)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        archive.writestr(_CODE[abi.target], code)
        if library is not None:
            archive.writestr(LIBRARY, library)
    path = Path(path)
    # Written whole, then renamed: a reader never sees half a file.
    temporary = path.with_name(path.name + ".part")
    temporary.write_bytes(buffer.getvalue())
    os.replace(temporary, path)


def _manifest_digest(manifest: dict) -> str:
    """The SHA-256 of the manifest's content without its own digest."""
    content = {key: value for key, value in manifest.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


#: What a damaged archive makes `zipfile` raise: besides BadZipFile, a
#: flipped compression method is NotImplementedError, a flipped flag bit an
#: "encrypted" RuntimeError, a cut entry EOFError or struct.error.
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, NotImplementedError, RuntimeError, EOFError,
               ValueError, struct.error)


def read_manifest(path) -> dict:
    """The manifest of the artifact at `path`, without reading or checking
    its code (to list saved kernels quickly)."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MANIFEST))
    except FileNotFoundError:
        raise
    except _ZIP_ERRORS + (KeyError,) as error:
        raise ArtifactError(f"{path} is not a readable ETC artifact ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not an ETC artifact")
    return manifest


def read(path) -> tuple[dict, KernelABI, bytes]:
    """The manifest, ABI and code of the artifact at `path`, checked."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise
    except _ZIP_ERRORS as error:
        raise ArtifactError(f"{path} is not an ETC artifact (not a readable zip archive: "
                            f"{error})") from None
    with archive:
        try:
            manifest = json.loads(archive.read(MANIFEST))
        except KeyError:
            raise ArtifactError(f"{path} is not an ETC artifact (no {MANIFEST})") from None
        except _ZIP_ERRORS as error:  # json's errors are ValueErrors
            raise ArtifactError(f"{path}: the manifest is damaged ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArtifactError(f"{path} is not an ETC artifact (format "
                                f"{manifest.get('format') if isinstance(manifest, dict) else None!r})")
        version = manifest.get("version")
        if version not in READ_VERSIONS:
            raise ArtifactError(
                f"{path} has artifact format version {version}, but this runtime reads version "
                f"{FORMAT_VERSION} (and {READ_VERSIONS[0]}): load it with the ETC release that "
                "saved it, or compile and save the kernel again")
        target = manifest.get("target")
        if target not in _CODE:
            raise ArtifactError(f"{path}: unknown target {target!r}")
        code_info = manifest.get("code")
        if not isinstance(code_info, dict):
            raise ArtifactError(f"{path}: the manifest is damaged (no 'code' entry)")
        try:
            code = archive.read(code_info.get("name", _CODE[target]))
        except KeyError:
            raise ArtifactError(f"{path} is damaged: the code {code_info.get('name')!r} is "
                                "missing") from None
        except _ZIP_ERRORS as error:  # e.g. a CRC mismatch
            raise ArtifactError(f"{path} is damaged: {error}") from None
    if manifest.get("sha256") != _manifest_digest(manifest):
        raise ArtifactError(f"{path} is damaged: the manifest does not match its checksum")
    if hashlib.sha256(code).hexdigest() != code_info.get("sha256"):
        raise ArtifactError(f"{path} is damaged: the code does not match its checksum")
    try:
        abi = KernelABI.from_json(manifest["abi"])
    except (KeyError, ValueError, TypeError) as error:
        raise ArtifactError(f"{path}: {error}") from None
    if abi.target != target:
        raise ArtifactError(f"{path}: the manifest says target {target!r} but its ABI says "
                            f"{abi.target!r}")
    if target == "cpu" and manifest.get("platform") != host_platform():
        raise ArtifactError(
            f"{path} holds CPU code for {manifest.get('platform')}, and this machine is "
            f"{host_platform()}: save the kernel on a machine like this one")
    if target == "cpu":
        from .isa import ISAError, check

        try:
            check(abi.isa, str(path))
        except ISAError as error:
            raise ArtifactError(str(error)) from None
    return manifest, abi, code


class LoadedKernel(Kernel):
    """A kernel loaded from an artifact: `run(**arrays)` like a compiled
    kernel, `arguments` (the ABI's, in order), `abi`, `trace` (traced
    kernels), and `ptx` for CUDA."""

    def __init__(self, path, manifest: dict, abi: KernelABI, runtime, code: bytes,
                 library: bytes | None = None):
        super().__init__(abi, runtime)
        self.path = str(path)
        self.manifest = manifest
        self._code = code
        self._library = library

    @property
    def metadata(self) -> dict:
        """What the saver recorded with the kernel (`save(..., metadata=)`)."""
        return self.manifest.get("metadata") or {}

    def save(self, path, metadata: dict | None = None) -> None:
        """Writes the artifact again to `path`, with its metadata or
        `metadata` instead."""
        write(path, self.abi, self._code, self.metadata if metadata is None else metadata,
              library=self._library)

    def __repr__(self) -> str:
        return (f"<LoadedKernel {self.abi.name} target={self.abi.target} chip={self.abi.chip} "
                f"schedule={self.abi.schedule} from {self.path}>")


def load(path, *, workers: int | None = None) -> LoadedKernel:
    """Loads the artifact at `path` (see the module docstring). `workers`
    overrides the CPU thread count it was compiled for."""
    manifest, abi, code = read(path)
    if abi.target == "cpu":
        from .cpu import CPURuntime, EntryPoints

        library = _load_library(code)
        if abi.extra.get("ranks", 1) > 1:
            from .distributed import DistributedCPURuntime as CPURuntime  # noqa: F811
        runtime = CPURuntime(abi, EntryPoints.from_library(library, abi), workers)
    elif abi.extra.get("ranks", 1) > 1:
        from .nvshmem import NVSHMEMRuntime

        library = read_library(path, manifest)
        runtime = NVSHMEMRuntime(abi, code.decode(), library.decode())
        return LoadedKernel(path, manifest, abi, runtime, code, library)
    else:
        from .cuda import CUDARuntime

        runtime = CUDARuntime(abi, code.decode())
    return LoadedKernel(path, manifest, abi, runtime, code)


def read_library(path, manifest: dict) -> bytes:
    """NVSHMEM's device library PTX of the CUDA artifact at `path` on
    several ranks (its manifest `manifest`, from `read`), checked."""
    info = manifest.get("library")
    if not isinstance(info, dict):
        raise ArtifactError(f"{path} holds a CUDA program on several ranks but not NVSHMEM's "
                            "device library it links with: compile and save it again")
    try:
        with zipfile.ZipFile(path) as archive:
            library = archive.read(info.get("name", LIBRARY))
    except KeyError:
        raise ArtifactError(f"{path} is damaged: {info.get('name')!r} is missing") from None
    except _ZIP_ERRORS as error:
        raise ArtifactError(f"{path} is damaged: {error}") from None
    if hashlib.sha256(library).hexdigest() != info.get("sha256"):
        raise ArtifactError(f"{path} is damaged: NVSHMEM's device library does not match its "
                            "checksum")
    return library


def _load_library(code: bytes):
    """Loads shared-library bytes with ctypes (through a private temporary
    file, removed once loaded)."""
    import ctypes

    handle, name = tempfile.mkstemp(prefix="etc-kernel-", suffix=".so")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(code)
        try:
            return ctypes.CDLL(name)
        except OSError as error:
            raise ArtifactError(f"the CPU code of the artifact cannot be loaded: {error}") from None
    finally:
        os.unlink(name)
