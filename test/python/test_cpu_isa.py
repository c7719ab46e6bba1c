"""CPU kernels compiled for an x86-64 instruction set: this machine's by
default (the best level it runs and its extensions, AVX-512 BF16 and AMX
among them), a named level (with extensions) by `ETC_CPU_ISA`. The
instruction set is recorded in the ABI and the artifact, the saved library
holds no instruction beyond it (read back with objdump), and loading checks
the host's features (CPUID) and refuses a CPU that lacks one, naming it,
instead of dying of SIGILL on the first run. Under `qemu-x86_64 -cpu
Nehalem` (an x86-64-v2 CPU), when qemu-user is installed, a v3 artifact is
refused and a v2 one runs. AMX needs the tile state from Linux, which the
CPU runtime asks for before a kernel with AMX runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import etc
from etc.runtime import ArtifactError, isa

pytestmark = pytest.mark.skipif(not isa.is_x86_64(), reason="x86-64 levels only")

needs_v3 = pytest.mark.skipif(not isa.host_supports("x86-64-v3"),
                              reason="this CPU runs no x86-64-v3 code")


def _graph():
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 64), "f32")
    w = g.input("w", (64, 96), "f32")
    h = g.input("h", (B, 96), "f16")
    # f16 too: x86-64-v3 converts it with F16C, v2 calls libgcc's builtins.
    g.output(g.silu(g.matmul(x, w)), g.exp(h))
    return g


def _inputs(rows=5):
    rng = np.random.default_rng(0)
    return dict(x=rng.standard_normal((rows, 64)).astype(np.float32),
                w=(rng.standard_normal((64, 96)) / 8).astype(np.float32),
                h=rng.standard_normal((rows, 96)).astype(np.float16) / 4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A kernel saved for this machine (the default), for x86-64-v3 and
    for x86-64-v2."""
    root = tmp_path_factory.mktemp("isa")
    saved = {}
    levels = [None, "x86-64-v2"] + (["x86-64-v3"] if isa.host_supports("x86-64-v3") else [])
    for level in levels:
        previous = os.environ.pop(isa.ENVIRONMENT, None)
        if level:
            os.environ[isa.ENVIRONMENT] = level
        try:
            kernel = etc.compile(_graph(), target="cpu", workers=2)
        finally:
            os.environ.pop(isa.ENVIRONMENT, None)
            if previous is not None:
                os.environ[isa.ENVIRONMENT] = previous
        path = root / f"{level or 'default'}.etc"
        kernel.save(path)
        saved[level or "default"] = (kernel, path)
    return saved


def _disassembly(path, tmp_path) -> str:
    objdump = shutil.which("objdump")
    # binutils comes with the C++ compiler the build needs.
    assert objdump is not None, "objdump (binutils) is not on PATH"
    with zipfile.ZipFile(path) as archive:
        library = tmp_path / "kernel.so"
        library.write_bytes(archive.read("kernel.so"))
    return subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)],
                          capture_output=True, text=True, check=True).stdout


def test_host_features_agree_with_proc_cpuinfo():
    from_cpuid = isa.host_features()
    from_cpuinfo = isa._features_from_cpuinfo() & (set(isa.LEVELS["x86-64-v4"]) |
                                                   set(isa.EXTENSIONS))
    assert {"sse2", "cx8"} <= from_cpuid
    if os.path.exists("/proc/cpuinfo") and not os.environ.get("QEMU_CPU"):
        assert from_cpuid == from_cpuinfo


def test_kernels_are_compiled_for_this_machine_and_record_it(artifacts):
    host = isa.host()
    level, extensions = isa.parse(host)
    assert isa.host_supports(host) and host == isa.chosen()
    # The best level this CPU runs, and every extension it has.
    assert all(not isa.host_supports(newer) for newer in
               list(isa.LEVELS)[list(isa.LEVELS).index(level) + 1:])
    assert set(extensions) == {e for e in isa.EXTENSIONS if e in isa.host_features()
                               and isa.host_supports(isa.EXTENSIONS[e][0])}
    for name, want in (("default", host), ("x86-64-v2", "x86-64-v2")):
        kernel, path = artifacts[name]
        assert kernel.abi.isa == want
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("etc-artifact.json"))
        assert manifest["isa"] == want and manifest["abi"]["isa"] == want
        assert etc.runtime.load(path).abi.isa == want


def test_instruction_sets_name_a_level_and_extensions():
    assert isa.parse("x86-64-v4") == ("x86-64-v4", ())
    # Extensions in the order of isa.EXTENSIONS, however they were written.
    assert isa.canonical("x86-64-v4+amx-bf16+avx512bf16+amx-tile") == \
        "x86-64-v4+avx512bf16+amx-tile+amx-bf16"
    assert isa.features("x86-64-v4+avx512bf16")[-1] == "avx512bf16"
    assert isa.llvm_attributes("x86-64-v4+avx512bf16") == (
        "x86-64-v4", ",".join("+" + f for f in isa.LEVELS["x86-64-v4"] + ("avx512bf16",)))
    assert isa.has("x86-64-v4+avx512bf16", "avx512bf16")
    assert not isa.has("x86-64-v4", "avx512bf16") and not isa.has(None, "avx512bf16")
    for bad, message in (("haswell", r"does not start with an x86-64 level"),
                         ("x86-64-v4+sse5", r"'sse5' is not an extension ETC knows"),
                         ("x86-64-v3+avx512bf16", r"avx512bf16 needs x86-64-v4 or newer"),
                         ("x86-64-v4+amx-bf16", r"amx-bf16 needs amx-tile too")):
        with pytest.raises(isa.ISAError, match=message):
            isa.parse(bad)


# AVX-512: any zmm or mask register, or an instruction only AVX-512 has.
_AVX512 = re.compile(r"%zmm|%k[0-7]\b|\{%k|vpternlog|vpermt2|vpermi2|vcompress|vexpand|"
                     r"vpmovq|vpmovd|vrndscale|vrcp14|vrsqrt14|vscalef|vfixupimm|vgetexp|"
                     r"vpconflict")
# AVX and newer: any ymm register or VEX-encoded instruction.
_AVX = re.compile(r"%ymm|\bv[a-z0-9]+\s")


@needs_v3
def test_the_library_holds_no_instruction_beyond_its_level(artifacts, tmp_path):
    v3 = _disassembly(artifacts["x86-64-v3"][1], tmp_path)
    assert not _AVX512.findall(v3)[:5]
    assert "%ymm" in v3  # the vector code is there, 256 bits wide
    v2 = _disassembly(artifacts["x86-64-v2"][1], tmp_path)
    assert not _AVX.findall(v2)[:5]
    assert "%xmm" in v2


def test_both_levels_compute_the_same(artifacts):
    want = etc.reference.evaluate(_graph(), **_inputs())
    for name, (kernel, path) in artifacts.items():
        for got, expected in zip(etc.runtime.load(path).run(**_inputs()), want):
            np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32),
                                       rtol=2e-3, atol=2e-3, err_msg=name)


@needs_v3
def test_a_cpu_without_the_features_is_refused_by_name(artifacts, monkeypatch):
    _, path = artifacts["x86-64-v3"]
    # A CPU of x86-64-v2 with no AVX: what CPUID reports on Nehalem.
    monkeypatch.setattr(isa, "host_features", lambda: frozenset(isa.LEVELS["x86-64-v2"]))
    with pytest.raises(ArtifactError, match=r"holds CPU code for x86-64-v3, and this "
                                            r"machine's CPU lacks avx, avx2, bmi, bmi2, f16c, "
                                            r"fma, lzcnt, movbe, xsave: running it would stop "
                                            r"the process with an illegal instruction; compile "
                                            r"it again with ETC_CPU_ISA=x86-64-v2 \(what "
                                            r"this CPU runs\)"):
        etc.runtime.load(path)
    etc.runtime.load(artifacts["x86-64-v2"][1])  # its own level is fine


def test_the_environment_variable_is_checked(monkeypatch):
    monkeypatch.setenv(isa.ENVIRONMENT, "haswell")
    with pytest.raises(isa.ISAError, match=r"ETC_CPU_ISA='haswell' is not an x86-64 "
                                           r"instruction set: 'haswell' does not start with"):
        isa.chosen()
    monkeypatch.setenv(isa.ENVIRONMENT, "host")
    assert isa.chosen() == isa.host()
    monkeypatch.setattr(isa, "host_features", lambda: frozenset(isa.LEVELS["x86-64-v2"]))
    monkeypatch.setenv(isa.ENVIRONMENT, "x86-64-v3")
    with pytest.raises(isa.ISAError, match=r"this machine's CPU lacks avx"):
        isa.chosen()
    monkeypatch.delenv(isa.ENVIRONMENT)
    assert isa.chosen() == "x86-64-v2"  # the best this CPU runs


# ----------------------------------------------------------------------
# On an older CPU, emulated
# ----------------------------------------------------------------------

_RUN = textwrap.dedent("""
    import sys
    sys.modules["mlir"] = None  # the runtime alone, as on a deploy machine
    import numpy as np
    import etc.runtime
    try:
        kernel = etc.runtime.load(sys.argv[1])
    except etc.runtime.ArtifactError as error:
        print("refused:", error)
        raise SystemExit(3)
    inputs = dict(np.load(sys.argv[2]))
    np.savez(sys.argv[3], *kernel.run(**inputs))
    print("ran")
""")


@needs_v3
def test_an_older_cpu_refuses_v3_and_runs_v2_under_qemu(artifacts, tmp_path):
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.skip("qemu-x86_64 is not installed (Debian: apt-get install qemu-user)")
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    np.savez(tmp_path / "inputs.npz", **_inputs())
    python = os.path.realpath(sys.executable)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    outcomes = {}
    for name in ("x86-64-v3", "x86-64-v2"):
        result = subprocess.run([qemu, "-cpu", "Nehalem", python, str(script),
                                 str(artifacts[name][1]), str(tmp_path / "inputs.npz"),
                                 str(tmp_path / f"{name}.npz")],
                                capture_output=True, text=True, timeout=600, env=environment)
        outcomes[name] = (result.returncode, result.stdout + result.stderr)
    code, text = outcomes["x86-64-v3"]
    assert code == 3, text  # not -4 (SIGILL)
    assert "holds CPU code for x86-64-v3, and this machine's CPU lacks avx" in text
    code, text = outcomes["x86-64-v2"]
    assert code == 0 and "ran" in text, text
    got = np.load(tmp_path / "x86-64-v2.npz")
    for i, want in enumerate(etc.reference.evaluate(_graph(), **_inputs())):
        np.testing.assert_allclose(got[f"arr_{i}"].astype(np.float32), want.astype(np.float32),
                                   rtol=2e-3, atol=2e-3)


# ----------------------------------------------------------------------
# AMX state
# ----------------------------------------------------------------------


def test_amx_state_is_asked_for_only_for_code_with_amx(monkeypatch):
    asked = []
    monkeypatch.setattr(isa, "request_amx", lambda: asked.append(True))
    for without in (None, "x86-64-v3", "x86-64-v4+avx512bf16"):
        isa.prepare(without)
    assert not asked
    isa.prepare("x86-64-v4+amx-tile+amx-bf16")
    assert asked == [True]


def test_linux_grants_the_amx_state_or_the_refusal_says_why():
    if "amx-tile" in isa.host_features():
        isa.request_amx()  # granted; asking again is free
        isa.request_amx()
    else:
        with pytest.raises(isa.ISAError, match=r"Linux refused the AMX tile state "
                                               r"\(arch_prctl\(ARCH_REQ_XCOMP_PERM, "
                                               r"XFEATURE_XTILEDATA\): E[A-Z]+, .*: kernels "
                                               r"compiled with amx-tile cannot run"):
            isa.request_amx()


def test_the_cpu_runtime_asks_for_the_amx_state_before_a_run(monkeypatch):
    """A kernel whose instruction set has the tile unit: its runtime asks
    (here a stand-in that refuses, as Linux does without AMX), and the
    refusal is the compile's error, before anything runs."""
    if not isa.host_supports("x86-64-v4"):
        pytest.skip("the JIT compiles x86-64-v4 code only where it runs")

    def refuse():
        raise isa.ISAError("refused for the test")

    monkeypatch.setattr(isa, "request_amx", refuse)
    monkeypatch.setattr(isa, "chosen", lambda: "x86-64-v4+amx-tile")
    monkeypatch.setattr(isa, "host_features",
                        lambda: frozenset(isa.LEVELS["x86-64-v4"]) | {"amx-tile"})
    g = etc.Graph("plain")
    g.output(g.exp(g.input("x", (4,), "f32")))
    with pytest.raises(isa.ISAError, match="refused for the test"):
        etc.compile(g, target="cpu", workers=1)
