"""The compile cache: step kernels saved as artifacts, found again by a key
of everything that changes their code.

A model's step kernel depends on the model's config (not its weights), the
graph options (`dtype`, `max_seq_len`, the attention chunk), the compile
options (target, chip or host platform, schedule, workers, tile kernels),
the artifact format, and the compiler itself: ETC's version and a
fingerprint of its sources and built extension. `describe` gathers those
into a JSON-able description; its SHA-256 is the key, and
`<directory>/<key>.etc` the artifact (`etc.runtime.load` reads it, with the
description in its manifest's metadata). A second `etc.models.load` of the
same model on the same installation loads that file and compiles nothing;
this module needs no MLIR, so a machine with only the runtime can.

The directory is `ETC_CACHE_DIR`, or `etc` under `XDG_CACHE_HOME` (default
`~/.cache`). `ETC_CACHE=0` turns the cache off for loads that do not say.

Processes that miss the same key at the same time (the ranks of a
tensor-parallel model, which share one step kernel; two servers started
together) compile it once: the first holds a lock on `.<key>.lock` while
it compiles and saves; the others wait for it and load its artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from ...runtime.abi import DEFAULT_LANES

__all__ = ["KernelCache", "CacheEntry", "default_directory", "enabled_by_default", "describe",
           "fingerprint", "key_of", "differences", "METADATA_KEY"]

#: The key of the model description in an artifact manifest's metadata.
METADATA_KEY = "etc.model"
_SUFFIX = ".etc"
#: Parts of the package that cannot change a kernel's code: editing them
#: keeps the cache.
_NOT_COMPILER = ("serve", "cli")


def default_directory() -> Path:
    """`ETC_CACHE_DIR`, else `$XDG_CACHE_HOME/etc`, else `~/.cache/etc`."""
    explicit = os.environ.get("ETC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "etc"


def enabled_by_default() -> bool:
    """Whether loads that do not say use the cache: yes, unless the
    environment sets `ETC_CACHE` to 0, false, no or off."""
    return os.environ.get("ETC_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("etc-compiler")
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        return "unknown"


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """SHA-256 of ETC's Python sources (the serving layer and the command
    line aside) and of its built extension, read from disk without
    importing the compiler: two installations of the same build agree."""
    package = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*.py")
                   if p.relative_to(package).parts[0] not in _NOT_COMPILER)
    spec = importlib.util.find_spec("etc._etc")
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        files.append(Path(spec.origin))
    for path in files:
        name = path.name if path.suffix != ".py" else str(path.relative_to(package))
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def describe(config, graph: dict, compile: dict) -> dict:
    """What a model's step kernel's code depends on: the model `config` (a
    `ModelConfig`), the `graph` options of `build_step_graph`, the `compile`
    options of `etc.compile` (target, chip or platform, schedule, ...), the
    artifact format, ETC's version and the compiler's fingerprint."""
    from ...runtime.artifact import FORMAT_VERSION, host_platform

    compile = dict(compile)
    if compile.get("target") == "cpu":
        # The CPU code is native code for this platform; the chip is unused.
        compile.pop("chip", None)
        compile["platform"] = host_platform()
        # ... and for an instruction-set level (ETC_CPU_ISA may pick another).
        from ...runtime.isa import chosen, opt_level

        compile["isa"] = chosen()
        # ... at LLVM's optimisation level (ETC_CPU_OPT_LEVEL may pick
        # another; simulated GPU kernels are always compiled at 0).
        if compile.get("kernels", "native") == "native":
            compile["opt_level"] = opt_level()
        elif compile.get("kernels") == "cuda":
            # The simulated worker's threads per CTA, as on CUDA.
            compile["lanes"] = compile.get("lanes") or DEFAULT_LANES
    elif compile.get("target") == "cuda":
        from ...ops.matmul_wgmma import MatmulWGMMA

        # Hopper tiles with TMA loads (`tma_loads()`) are other code, and
        # so are warp-specialised ones (`warp_specialised()`).
        if MatmulWGMMA.tma:
            compile["wgmma_tma"] = True
        if MatmulWGMMA.warp_specialised:
            compile["wgmma_ws"] = True
        # The worker's threads per CTA (the tiles are written for them);
        # its `min_ctas`, when given, is in `compile` already.
        compile["lanes"] = compile.get("lanes") or DEFAULT_LANES
    return {"etc": _version(), "compiler": fingerprint(), "artifact": FORMAT_VERSION,
            "model": json.loads(json.dumps(asdict(config))), "graph": dict(graph),
            "compile": compile}


def key_of(description: dict) -> str:
    """The cache key of a description: the SHA-256 of its canonical JSON."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def differences(found: dict, wanted: dict, prefix: str = "") -> list[str]:
    """The fields in which description `found` differs from `wanted`, as
    "field: found vs wanted" lines (for errors about a kernel file)."""
    lines = []
    for name in sorted(set(found) | set(wanted)):
        a, b = found.get(name), wanted.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += differences(a, b, f"{prefix}{name}.")
        elif a != b:
            lines.append(f"{prefix}{name}: {a!r} in the kernel, {b!r} wanted")
    return lines


@dataclass(frozen=True)
class CacheEntry:
    """One cached kernel: its file, key, size, when it was written, and the
    description it was compiled from."""

    path: Path
    key: str
    bytes: int
    created: float
    description: dict

    @property
    def summary(self) -> str:
        """One line: the architecture, sizes and every option that changes
        the kernel's code (kernels that differ have different lines)."""
        d = self.description
        model, graph, options = d.get("model", {}), d.get("graph", {}), d.get("compile", {})
        where = options.get("chip") or options.get("platform")
        # Packed weights: how many in each format (the others are in dtype).
        formats = {}
        for fmt in (graph.get("weight_formats") or {}).values():
            formats[fmt] = formats.get(fmt, 0) + 1
        packed = "".join(f" {fmt}x{count}" for fmt, count in sorted(formats.items()))
        return (f"{model.get('architecture', '?')} layers={model.get('num_layers')} "
                f"hidden={model.get('hidden_size')} vocab={model.get('vocab_size')} "
                f"dtype={graph.get('dtype')}{' packed:' + packed if packed else ''} "
                f"max_seq_len={graph.get('max_seq_len')} "
                f"chunk={graph.get('chunk')} kv_block_size={graph.get('kv_block_size')} "
                f"kv_dtype={graph.get('kv_dtype')} "
                + (f"ranks={graph['ranks']} " if graph.get("ranks") else "")
                + f"target={options.get('target')} {where} schedule={options.get('schedule')} "
                f"workers={options.get('workers')} kernels={options.get('kernels')}"
                # The worker's bounds where not the default's (CUDA kernels).
                + (f" lanes={options['lanes']}"
                   if options.get("lanes", DEFAULT_LANES) != DEFAULT_LANES else "")
                + (f" min_ctas={options['min_ctas']}" if options.get("min_ctas") else ""))


class KernelCache:
    """Step kernels in one directory (see the module docstring)."""

    def __init__(self, directory=None):
        self.directory = Path(directory) if directory is not None else default_directory()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    def get(self, key: str, *, workers: Optional[int] = None):
        """The kernel saved under `key`, loaded (`etc.runtime.load`), or
        None when there is none. A damaged or unloadable file is removed,
        with a warning, and counts as missing."""
        from ...runtime import ArtifactError, load

        path = self.path(key)
        if not path.is_file():
            return None
        try:
            return load(path, workers=workers)
        except (ArtifactError, OSError) as error:
            warnings.warn(f"the compile cache's {path} cannot be loaded ({error}); it is "
                          f"removed and the kernel compiled again", RuntimeWarning,
                          stacklevel=3)
            path.unlink(missing_ok=True)
            return None

    @contextlib.contextmanager
    def compiling(self, key: str):
        """Holds the lock of `key` (an exclusive `flock` of `.<key>.lock`,
        released when the holder ends, however it ends) while the caller
        looks again, compiles and saves. Where the directory cannot hold a
        lock file (read-only, or no `fcntl`), it holds nothing: each process
        then compiles for itself, as without the lock."""
        try:
            import fcntl

            self.directory.mkdir(parents=True, exist_ok=True)
            handle = os.open(self.directory / f".{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # releases the lock

    def put(self, key: str, kernel, description: dict) -> Optional[Path]:
        """Saves `kernel` under `key` with `description`. Written to a
        private file and renamed, so that a concurrent reader or writer
        never sees half a file. A failure to save (no C compiler for a CPU
        kernel, a read-only directory) warns and returns None: the cache is
        an optimisation, never the reason a load fails."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=f".{key}-", suffix=".part",
                                                 dir=self.directory)
            os.close(handle)
            try:
                kernel.save(temporary, metadata={METADATA_KEY: description})
                os.replace(temporary, self.path(key))
            finally:
                if os.path.exists(temporary):
                    os.unlink(temporary)
        except (OSError, RuntimeError) as error:
            warnings.warn(f"the step kernel could not be saved in the compile cache "
                          f"{self.directory} ({error}); the next load compiles again",
                          RuntimeWarning, stacklevel=3)
            return None
        return self.path(key)

    def entries(self) -> list[CacheEntry]:
        """The cached kernels, oldest first (files that are not artifacts
        are left out)."""
        from ...runtime import ArtifactError
        from ...runtime.artifact import read_manifest

        found = []
        if not self.directory.is_dir():
            return found
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                manifest = read_manifest(path)
            except (ArtifactError, OSError):
                continue
            stat = path.stat()
            found.append(CacheEntry(path, path.stem, stat.st_size, stat.st_mtime,
                                    (manifest.get("metadata") or {}).get(METADATA_KEY, {})))
        return sorted(found, key=lambda e: e.created)

    def clear(self) -> int:
        """Removes every cached kernel (and unfinished writes); returns how
        many kernels were removed."""
        removed = 0
        if not self.directory.is_dir():
            return removed
        for path in self.directory.iterdir():
            if path.suffix == _SUFFIX and path.is_file():
                path.unlink(missing_ok=True)
                removed += 1
            elif path.name.startswith(".") and path.suffix == ".lock":
                path.unlink(missing_ok=True)
            elif path.name.endswith(".part") and path.name.startswith(".") and \
                    time.time() - path.stat().st_mtime > 3600:
                path.unlink(missing_ok=True)
        return removed
