"""The GPU check kit's benchmarks: Markdown tables in GPU time, a child
process per section. CUDA events around GPU work only (a spin kernel keeps
the GPU busy while the host queues each timed run; "cold" runs follow an L2
flush): device-to-device copy bandwidth, notify->wake latency, per-task
overhead, bf16 GEMV in GB/s, one line per tile kernel, the MLP block and a
decode step against PyTorch eager and CUDA graphs (ETC also as a CUDA graph
where the driver can capture it), a bf16 GEMM, x·Wᵀ with known rows (the
Hopper wgmma tile) against cuBLAS and a copy, and the x·Wᵀ kernels at
prefill sizes.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import statistics
import time

import numpy as np

import etc.bfloat16
import etc.reference
import etc.runtime
import families
from etc.reference import round_bf16
from etc.runtime.cpu import _STORAGE as STORAGE
from etc.runtime.cuda import EventTimer as Timer
from harness import (KIT, Device, Report, best_chip, child_options, load_manifest,
                     resource_table, resources, run_child, runnable)

BATCHES = (1, 2, 4, 8, 16)
DECODE_BATCHES = (1, 4, 16, 64)


class Bench:
    """What a benchmark section works with (in its child process)."""

    def __init__(self, manifest, device: Device, args):
        self.manifest, self.device, self.args = manifest, device, args
        self.torch = torch_or_none()
        self.timer = Timer(device.driver, args.repeats)
        self.copy_gbs = args.copy_gbs
        self.resources: list[dict] = []

    def entries(self, kind, **match):
        return bench_entries(self.manifest, self.device, kind, **match)

    def note(self, kernel, label: str) -> None:
        """Records `kernel`'s worker resources (after it has run) once."""
        if not any(r["artifact"] == label for r in self.resources):
            self.resources.append(resources(kernel, label))

    def torch_ms(self, fn, graph: bool = False, repeats: int | None = None) -> float:
        return torch_time(self.torch, self.timer, fn, repeats or self.timer.repeats, graph)


def bench_entries(manifest, device, kind, **match):
    return [e for e in manifest["artifacts"] if e["kind"] == kind and runnable(e, device)
            and e["chip"] == best_chip(manifest, device)
            and all(e.get(k) == v for k, v in match.items())]


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_time(torch, timer, fn, repeats: int, graph: bool = False) -> float:
    """Median GPU ms of `fn` (`graph`: captured once as a CUDA graph and
    replayed) between torch CUDA events, each timed run queued behind the
    timer's spin kernel, so that the window holds GPU work only (PyTorch
    eager's host time is not in it)."""
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        fn = captured.replay
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    fn()
    end.record()
    host_ns = (time.perf_counter() - began) * 1e9
    torch.cuda.synchronize()
    spin = int(min(max(4 * host_ns, Timer.MIN_SPIN_NS), Timer.MAX_SPIN_NS))
    times = []
    for _ in range(repeats):
        timer.spin(stream.cuda_stream, spin)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def etc_graph_ms(b: Bench, launch) -> tuple[float | None, str]:
    """GPU ms of `launch` captured as a CUDA graph, or None and why not."""
    try:
        replay = b.timer.graph(launch.enqueue)
        replay(b.timer.stream)
        launch.check(b.timer.stream)
    except RuntimeError as error:
        return None, f"ETC as a CUDA graph: capture failed: {error}"
    return b.timer(replay), ""


def verified(launch, expected, tolerance: float, what: str) -> None:
    """Never time wrong outputs (or zeros): the bound run must match."""
    launch.enqueue()
    launch.check()
    got = launch.outputs()[0]
    error = families.relative_error(got, expected)
    if not error <= tolerance:
        raise RuntimeError(f"{what}: relative error {error:.3g} > {tolerance:g} before timing")


# ---------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------

def bench_copy(b: Bench) -> list[str]:
    """Device-to-device copy, GB/s counting bytes read and written."""
    d, check = b.device.driver, b.device.check
    nbytes = b.args.copy_mib << 20
    src = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    dst = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    check(d, "cuMemsetD8", d.cuMemsetD8(src, 1, nbytes))
    try:
        ms = b.timer(lambda s: check(d, "cuMemcpyDtoDAsync", d.cuMemcpyDtoDAsync(dst, src, nbytes,
                                                                                  s)))
    finally:
        check(d, "cuMemFree", d.cuMemFree(src))
        check(d, "cuMemFree", d.cuMemFree(dst))
    b.copy_gbs = 2 * nbytes / ms / 1e6
    return [f"Device-to-device copy ({b.args.copy_mib} MiB, bytes read + written): "
            f"**{b.copy_gbs:.0f} GB/s**"]


def bench_latency(b: Bench) -> list[str]:
    rows = ["| chain length K | worker CTAs | megakernel µs | per hop µs |",
            "|---:|---:|---:|---:|"]
    base = None
    for entry in sorted(b.entries("latency"), key=lambda e: e["length"]):
        kernel = etc.runtime.load(KIT / entry["path"])
        launch = kernel.runtime.bind({"x": np.ones((1, 96), np.float32)})
        ms = b.timer(launch.enqueue)
        b.note(kernel, entry["path"])
        k = entry["length"]
        hop = "—" if base is None else f"{(ms - base[1]) * 1000 / (k - base[0]):.2f}"
        base = base or (k, ms)
        rows.append(f"| {k} | {kernel.runtime.workers} | {ms * 1000:.1f} | {hop} |")
    return rows


def bench_overhead(b: Bench, tasks=(1024, 16384)) -> list[str]:
    rows = ["| tasks | static µs | static ns/task | dynamic µs | dynamic ns/task |",
            "|---:|---:|---:|---:|---:|"]
    kernels = {e["schedule"]: (etc.runtime.load(KIT / e["path"]), e["path"])
               for e in b.entries("overhead")}
    for n in tasks:
        cells = [str(n)]
        x = np.ones((n, 96), np.float32)
        for schedule in ("static", "dynamic"):
            kernel, path = kernels[schedule]
            launch = kernel.runtime.bind({"x": x})
            verified(launch, 2 * x, 1e-6, f"wide {schedule}")
            b.note(kernel, path)
            ms = b.timer(launch.enqueue)
            cells += [f"{ms * 1000:.1f}", f"{ms * 1e6 / n:.0f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_gemv(b: Bench) -> list[str]:
    """Cold: the weights come from device memory (L2 flushed before each
    run); hot: back-to-back runs, the weights partly in L2."""
    torch = b.torch
    rows = ["| y = x·W | W stored | B | ETC µs cold | ETC GB/s cold | % of copy | ETC µs hot | "
            "PyTorch µs cold | PyTorch GB/s cold |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(0)
    for entry in b.entries("gemv"):
        k, n, transposed = entry["k"], entry["n"], entry.get("transposed", False)
        kernel = etc.runtime.load(KIT / entry["path"])
        w = round_bf16(rng.standard_normal((n, k) if transposed else (k, n), np.float32) * 0.02)
        w_device = kernel.runtime.device_array(etc.bfloat16.to_bits(w))
        tw = torch.from_numpy(w).to("cuda", torch.bfloat16) if torch else None
        for batch in BATCHES:
            x = round_bf16(rng.standard_normal((batch, k), np.float32))
            launch = kernel.runtime.bind({"x": x, "w": w_device})
            verified(launch, x @ (w.T if transposed else w), 2e-2, f"{entry['path']} B={batch}")
            b.note(kernel, entry["path"])
            cold = b.timer(launch.enqueue, cold=True)
            hot = b.timer(launch.enqueue)
            nbytes = 2 * (k * n + batch * k + batch * n)
            gbs = nbytes / cold / 1e6
            cells = [f"K={k}, N={n}", "(N, K): x·Wᵀ" if transposed else "(K, N)", str(batch),
                     f"{cold * 1000:.1f}", f"{gbs:.0f}", f"{100 * gbs / b.copy_gbs:.0f}%",
                     f"{hot * 1000:.1f}"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                fn = ((lambda: torch.nn.functional.linear(tx, tw)) if transposed
                      else (lambda: torch.matmul(tx, tw)))
                tms = torch_time_cold(b, fn)
                cells += [f"{tms * 1000:.1f}", f"{nbytes / tms / 1e6:.0f}"]
            else:
                cells += ["n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def torch_time_cold(b: Bench, fn) -> float:
    """`torch_time` with the L2 flushed before each timed run (the flush
    queued on PyTorch's stream, before the start event)."""
    torch = b.torch
    stream = torch.cuda.current_stream().cuda_stream

    def flushed():
        b.timer.flush(stream)
        start.record()
        fn()
        end.record()

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(b.timer.repeats):
        b.timer.spin(stream, Timer.MIN_SPIN_NS)
        flushed()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def variants(entries) -> dict:
    """Benchmark entries by variant ("static", "dynamic", "static, no
    prefetch"; kits built before variants: the schedule), static first."""
    found = {e.get("variant", e["schedule"]): e for e in entries}
    return dict(sorted(found.items(), key=lambda item: item[0] != "static"))


def bench_mlp(b: Bench) -> list[str]:
    torch = b.torch
    entries = variants(b.entries("mlp"))
    if not entries:
        return []
    hidden, ffn = entries["static"]["hidden"], entries["static"]["ffn"]
    rng = np.random.default_rng(1)
    weights = {"nw": round_bf16(1 + 0.1 * rng.standard_normal(hidden, np.float32)),
               "w1": round_bf16(rng.standard_normal((hidden, ffn), np.float32) * 0.02),
               "w2": round_bf16(rng.standard_normal((ffn, hidden), np.float32) * 0.02)}
    kernels = {s: etc.runtime.load(KIT / e["path"]) for s, e in entries.items()}
    device_weights = {s: {name: k.runtime.device_array(etc.bfloat16.to_bits(w))
                          for name, w in weights.items()} for s, k in kernels.items()}
    rows = ["| B | " + " | ".join(f"ETC {v} µs" for v in entries)
            + " | ETC static, CUDA graph µs | PyTorch eager µs | PyTorch CUDA graph µs | "
              "static vs PyTorch graph |",
            "|---:|" + "---:|" * (len(entries) + 4)]
    notes = set()
    if torch:
        tw = {n: torch.from_numpy(w).to("cuda", torch.bfloat16) for n, w in weights.items()}

        def torch_block(tx):
            h = tx.float()
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
            h = h * tw["nw"]
            a = torch.nn.functional.silu(h @ tw["w1"])
            return a @ tw["w2"] + tx
    for batch in BATCHES:
        x = round_bf16(rng.standard_normal((batch, hidden), np.float32))
        expected = etc.reference.evaluate(kernels["static"], x=x, **weights)[0]
        cells = [str(batch)]
        times = {}
        for variant, kernel in kernels.items():
            launch = kernel.runtime.bind({"x": x, **device_weights[variant]})
            verified(launch, expected, 3e-2, f"mlp {variant} B={batch}")
            b.note(kernel, entries[variant]["path"])
            times[variant] = b.timer(launch.enqueue)
            cells.append(f"{times[variant] * 1000:.1f}")
            if variant == "static":
                graph_ms, note = etc_graph_ms(b, launch)
                notes.add(note)
        cells.append(f"{graph_ms * 1000:.1f}" if graph_ms else "n/a")
        if torch:
            tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
            eager = b.torch_ms(lambda: torch_block(tx))
            graph = b.torch_ms(lambda: torch_block(tx), graph=True)
            cells += [f"{eager * 1000:.1f}", f"{graph * 1000:.1f}",
                      f"{times['static'] / graph:.2f}×"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows + [f"({note})" for note in sorted(notes) if note]


def bench_gemm(b: Bench) -> list[str]:
    torch = b.torch
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | PyTorch ms | PyTorch TFLOP/s | ETC / PyTorch |",
            "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(2)
    for entry in b.entries("gemm"):
        size = entry["size"]
        kernel = etc.runtime.load(KIT / entry["path"])
        a = round_bf16(rng.standard_normal((size, size), np.float32))
        w = round_bf16(rng.standard_normal((size, size), np.float32) * 0.02)
        launch = kernel.runtime.bind({"a": a, "b": w})
        launch.enqueue()
        launch.check()
        b.note(kernel, entry["path"])
        rows_checked = slice(0, 64)
        error = families.relative_error(launch.outputs()[0][rows_checked], a[rows_checked] @ w)
        if not error <= 2e-2:
            raise RuntimeError(f"gemm {size}: relative error {error:.3g} before timing")
        ms = b.timer.within(launch.enqueue)
        flops = 2 * size ** 3
        cells = [f"{size}³", f"{ms:.2f}", f"{flops / ms / 1e9:.1f}"]
        if torch:
            ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
            tb = torch.from_numpy(w).to("cuda", torch.bfloat16)
            tms = b.torch_ms(lambda: torch.matmul(ta, tb), repeats=20)
            cells += [f"{tms:.2f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_hopper(b: Bench) -> list[str]:
    """x·Wᵀ with known rows, bf16, W stored (N, K): the wgmma tile on
    sm_90a, its operands loaded by every lane's cp.async or by TMA (one
    lane's cp.async.bulk.tensor from the runtime's tensor maps), or
    warp-specialised (256 lanes a worker CTA, 2 CTAs an SM: warpgroup 0's
    lane 0 runs the TMA ring, warpgroup 1 the wgmma, registers moved to it
    with setmaxnreg), mma.sync where the kit's best chip is sm_80, next to torch.matmul (cuBLAS) and
    a device-to-device copy of the bytes the product moves at least (x, W
    and the result once each). Ratios: ETC / cuBLAS in speed (above 1: ETC
    faster); ETC's time over the copy's."""
    torch = b.torch
    d, check = b.device.driver, b.device.check
    rows = ["| M×N×K | loads | ETC ms | ETC TFLOP/s | cuBLAS ms | cuBLAS TFLOP/s | "
            "ETC / cuBLAS | copy ms | ETC time / copy time |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(5)
    for entry in b.entries("hopper"):
        m, n, k = entry["m"], entry["n"], entry["k"]
        # Kits built before the TMA variant: cp.async.
        loads = entry.get("variant", "cp.async")
        kernel = etc.runtime.load(KIT / entry["path"])
        x = round_bf16(rng.standard_normal((m, k), np.float32))
        w = round_bf16(rng.standard_normal((n, k), np.float32) * 0.02)
        launch = kernel.runtime.bind({"x": x, "w": w})
        launch.enqueue()
        launch.check()
        b.note(kernel, entry["path"])
        # The first and the last 64 rows: whole and edge tiles, at a
        # NumPy cost the host can afford for 4096 x 14336 x 4096.
        for checked in (slice(0, 64), slice(max(m - 64, 0), m)):
            error = families.relative_error(launch.outputs()[0][checked], x[checked] @ w.T)
            if not error <= 2e-2:
                raise RuntimeError(f"x·Wᵀ {m}x{n}x{k} rows {checked.start}..{checked.stop}: "
                                   f"relative error {error:.3g} before timing")
        ms = b.timer.within(launch.enqueue)
        flops = 2 * m * n * k
        nbytes = 2 * (m * k + n * k + m * n)
        src = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
        dst = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
        try:
            copy_ms = b.timer(lambda s: check(d, "cuMemcpyDtoDAsync",
                                              d.cuMemcpyDtoDAsync(dst, src, nbytes, s)))
        finally:
            check(d, "cuMemFree", d.cuMemFree(src))
            check(d, "cuMemFree", d.cuMemFree(dst))
        cells = [f"{m}×{n}×{k}", loads, f"{ms:.3f}", f"{flops / ms / 1e9:.1f}"]
        if torch:
            tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
            tw = torch.from_numpy(w).to("cuda", torch.bfloat16)
            tms = b.torch_ms(lambda: torch.matmul(tx, tw.t()), repeats=20)
            cells += [f"{tms:.3f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        cells += [f"{copy_ms:.3f}", f"{ms / copy_ms:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


#: Rows of the prefill products (tokens of a prompt, or of a batch of them).
PREFILL_ROWS = (128, 512, 2048)


def checked_xwt(program, x, w, weight, what: str):
    """`program` (an x·Wᵀ artifact) bound to `x` and the device `weight`,
    run once and its first 32 rows checked against x·Wᵀ (W: `w` on the
    host), so that no wrong or zero output is timed; the bound launch."""
    launch = program.runtime.bind({"x": x, "w": weight})
    launch.enqueue()
    launch.check()
    checked = slice(0, 32)
    error = families.relative_error(launch.outputs()[0][checked], x[checked] @ w.T)
    if not error <= 2e-2:
        raise RuntimeError(f"{what}: relative error {error:.3g} before timing")
    return launch


def bench_prefill(b: Bench) -> list[str]:
    """The x·Wᵀ GEMV artifacts (symbolic rows) at prefill sizes: each tile
    of 16 rows or more takes the tensor cores, on the column tiles chosen
    for decode (few, narrow: issue #11 leaves wider prefill tiles open);
    TFLOP/s next to PyTorch's linear. On a Hopper GPU the sm_90a artifact
    multiplies with wgmma (`MatmulWGMMASkinnyT`, a call whose wgmma ptxas
    serialises) and the sm_80 one, which the driver also runs there, with
    mma.sync: its time is the A/B of the two."""
    torch = b.torch
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | ETC sm_80 artifact ms | PyTorch ms | "
            "PyTorch TFLOP/s | ETC / PyTorch |", "|---|---:|---:|---:|---:|---:|---:|"]
    chip = best_chip(b.manifest, b.device)
    older = {(e["k"], e["n"]): e for e in b.manifest["artifacts"]
             if e["kind"] == "gemv" and e.get("transposed") and e["chip"] == "sm_80"
             and chip != "sm_80" and runnable(e, b.device)}
    rng = np.random.default_rng(3)
    for entry in b.entries("gemv"):
        if not entry.get("transposed"):
            continue
        k, n = entry["k"], entry["n"]
        kernel = etc.runtime.load(KIT / entry["path"])
        w = round_bf16(rng.standard_normal((n, k), np.float32) * 0.02)
        w_device = kernel.runtime.device_array(etc.bfloat16.to_bits(w))
        tw = torch.from_numpy(w).to("cuda", torch.bfloat16) if torch else None
        other = etc.runtime.load(KIT / older[(k, n)]["path"]) if (k, n) in older else None
        other_w = other.runtime.device_array(etc.bfloat16.to_bits(w)) if other else None
        for m in PREFILL_ROWS:
            x = round_bf16(rng.standard_normal((m, k), np.float32))
            timed = []
            for program, weight in ((kernel, w_device), (other, other_w)):
                if program is None:
                    timed.append(None)
                    continue
                launch = checked_xwt(program, x, w, weight, f"prefill {m}x{n}x{k}")
                timed.append(b.timer.within(launch.enqueue))
            ms, other_ms = timed
            flops = 2 * m * n * k
            cells = [f"{m}×{n}×{k}", f"{ms:.3f}", f"{flops / ms / 1e9:.1f}",
                     "n/a" if other_ms is None else f"{other_ms:.3f}"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                tms = b.torch_ms(lambda: torch.nn.functional.linear(tx, tw), repeats=20)
                cells += [f"{tms:.3f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
            else:
                cells += ["n/a", "n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_packed(b: Bench) -> list[str]:
    """x·Wᵀ with W packed (Q4_K, Q6_K, Q8_0, Q5_0) against the same product
    with W in bf16 (the gemv_t artifact of that shape) and PyTorch's bf16
    linear: at decode batches the GEMV that reads whole blocks' quants in
    16-byte loads from the weight's GPU layout (repacked once by
    `device_array(blocks, dtype=...)`) and dequantizes them in registers
    (GB/s of the packed weight's bytes, cold), at prefill rows the tensor
    cores on tiles dequantized into shared memory (TFLOP/s)."""
    from etc import packed

    torch = b.torch
    rows = ["| W | rows | ETC packed µs | packed GB/s | TFLOP/s | ETC bf16 µs | packed / bf16 "
            "speed | PyTorch bf16 µs |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(4)
    for entry in b.entries("packed"):
        k, n, fmt = entry["k"], entry["n"], entry["format"]
        kernel = etc.runtime.load(KIT / entry["path"])
        bf16 = b.entries("gemv", k=k, n=n, transposed=True)
        dense = etc.runtime.load(KIT / bf16[0]["path"]) if bf16 else None
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        blocks = packed.quantize(w, fmt)
        w = packed.dequantize(blocks, fmt)
        w_device = kernel.runtime.device_array(blocks, dtype=fmt)  # repacked once (GPU layout)
        w16 = round_bf16(w)
        dense_w = dense.runtime.device_array(etc.bfloat16.to_bits(w16)) if dense else None
        tw = torch.from_numpy(w16).to("cuda", torch.bfloat16) if torch else None
        for m in (1, 16, *PREFILL_ROWS):
            x = round_bf16(rng.standard_normal((m, k), np.float32))
            launch = checked_xwt(kernel, x, w, w_device, f"packed {fmt} {m}x{n}x{k}")
            b.note(kernel, entry["path"])
            ms = b.timer(launch.enqueue, cold=True) if m < 16 else b.timer.within(launch.enqueue)
            cells = [f"{fmt.upper()} {n}×{k}", str(m), f"{ms * 1000:.1f}",
                     f"{blocks.nbytes / ms / 1e6:.0f}", f"{2 * m * n * k / ms / 1e9:.2f}"]
            if dense is not None:
                bound = dense.runtime.bind({"x": x, "w": dense_w})
                dms = b.timer(bound.enqueue, cold=True) if m < 16 else \
                    b.timer.within(bound.enqueue)
                cells += [f"{dms * 1000:.1f}", f"{dms / ms:.2f}x"]
            else:
                cells += ["n/a", "n/a"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                fn = lambda: torch.nn.functional.linear(tx, tw)  # noqa: E731
                tms = torch_time_cold(b, fn) if m < 16 else b.torch_ms(fn, repeats=20)
                cells.append(f"{tms * 1000:.1f}")
            else:
                cells.append("n/a")
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_roofline(b: Bench) -> list[str]:
    """One line per CUDA tile kernel: bytes (inputs and outputs, each moved
    once) and FLOPs over the cold time (L2 flushed), next to the copy
    bandwidth."""
    rows = ["| kernel | rows | µs cold | GB/s | % of copy | TFLOP/s | µs hot |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    sizes = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}
    for entry in b.entries("roofline"):
        kernel = etc.runtime.load(KIT / entry["path"])
        symbols = {a.name: entry["size"] for a in kernel.arguments if a.kind == "symbol"}
        rng = np.random.default_rng(4)
        recipe = families.Recipe(scales={"w": 0.02, "b": 0.02, "z": 1.0})
        inputs = families.make_inputs(kernel.arguments, symbols, recipe, rng)
        launch = kernel.runtime.bind(inputs)
        expected = etc.reference.evaluate(kernel, **inputs)[0]
        verified(launch, expected, 3e-2, entry["title"])
        b.note(kernel, entry["path"])
        cold = b.timer.within(launch.enqueue, cold=True)
        hot = b.timer.within(launch.enqueue)
        nbytes = 0
        for arg in kernel.arguments:
            if arg.kind in ("input", "output"):
                shape = [entry["size"] if isinstance(d, str) else d for d in arg.shape]
                nbytes += int(np.prod(shape)) * sizes[arg.dtype]
        gbs = nbytes / cold / 1e6
        tflops = f"{entry['flops'] / cold / 1e9:.2f}" if entry.get("flops") else "—"
        rows.append(f"| {entry['title']} | {entry['size']} | {cold * 1000:.1f} | {gbs:.0f} | "
                    f"{100 * gbs / b.copy_gbs:.0f}% | {tflops} | {hot * 1000:.1f} |")
    return rows


def decode_inputs(kernel, entry, batch: int, rng) -> dict:
    """Inputs of one decode step: `batch` requests, one new token each at
    position `prompt` (the cache rows before it hold zeros: the work, not
    the values, is what is timed); random bf16 weights (norms 1)."""
    prompt = entry["prompt"]
    config = entry["hf_config"]
    i32 = lambda values: np.asarray(values, np.int32)
    inputs = {"ids": i32(rng.integers(0, config["vocab_size"], batch)),
              "positions": i32([prompt] * batch), "token_request": i32(range(batch)),
              "request_length": i32([prompt + 1] * batch),
              "request_first": i32(range(batch)), "request_last": i32(range(batch)),
              "inv_freq": np.asarray(entry["inv_freq"], np.float32)}
    length = prompt + 8
    # A paged cache (pools (N, P, width)): each request's blocks are spread
    # over the pool in a shuffled order, as a serving engine's become.
    pools = [arg for arg in kernel.arguments if arg.kind == "state" and "N" in arg.shape]
    symbols = {"S": batch, "L": length}
    if pools:
        block = pools[0].shape[1]
        per_request = -(-length // block)
        symbols["N"] = batch * per_request
        order = rng.permutation(batch * per_request)
        inputs["block_table"] = i32(order.reshape(batch, per_request))
    else:
        inputs["request_slot"] = i32(range(batch))
    # Greedy sampling (temperature 0: the argmax), as a serving engine asks
    # for most often.
    f32 = lambda value: np.full(batch, value, np.float32)
    # A token is chosen after each request's one new token (C = batch).
    inputs.update(sample_rows=i32(range(batch)), sample_position=i32([prompt + 1] * batch))
    inputs.update(temperature=f32(0.0), top_p=f32(1.0), min_p=f32(0.0),
                  top_k=np.zeros(batch, np.int32), seed=np.zeros((batch, 2), np.int32),
                  logprobs=np.zeros(batch, np.int32))
    # No penalties, biases or token masks: one padding entry (-1) per
    # request (A = 1) and every token allowed (the step's mask unused).
    vocab_words = -(-config["vocab_size"] // 32)
    inputs.update(adjust_tokens=np.full((batch, 1), -1, np.int32),
                  adjust_add=np.zeros((batch, 1), np.float32),
                  adjust_scale=np.ones((batch, 1), np.float32),
                  token_mask=np.zeros((batch, vocab_words), np.int32),
                  token_masked=np.zeros(batch, np.int32))
    for arg in kernel.arguments:
        if arg.kind == "state":
            shape = [symbols.get(d, d) for d in arg.shape]
            inputs[arg.name] = kernel.runtime.device_zeros(tuple(shape), STORAGE[arg.dtype])
        elif arg.kind == "input" and arg.name not in inputs:
            if any(isinstance(d, str) for d in arg.shape):
                raise ValueError(f"decode step: input {arg.name} {tuple(arg.shape)} has a "
                                 "symbolic shape the kit does not fill (kit/benchmarks.py "
                                 "decode_inputs)")
            if arg.name.endswith("norm"):
                values = np.ones(arg.shape, np.float32)
            else:
                values = round_bf16(rng.standard_normal(arg.shape, np.float32) * 0.02)
            inputs[arg.name] = kernel.runtime.device_array(
                etc.bfloat16.to_bits(values) if arg.dtype == "bf16" else values)
    return inputs


def torch_decode_model(b: Bench, entry, batch: int):
    """(model, prompt ids, the transformers module): the decode step's model
    in transformers, bf16, random weights."""
    torch = b.torch
    import transformers
    transformers.logging.set_verbosity_error()
    config = dict(entry["hf_config"])
    model_type = config.pop("model_type")
    config.pop("architectures", None)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(model_type, **config), torch_dtype=torch.bfloat16)
    ids = torch.randint(0, config["vocab_size"], (batch, entry["prompt"]), device="cuda")
    return model.cuda().eval(), ids, transformers


def torch_decode_eager(b: Bench, entry, batch: int) -> float:
    """GPU ms of one decode step in transformers eager (a dynamic cache cut
    back to the prompt before each step)."""
    model, ids, _ = torch_decode_model(b, entry, batch)
    with b.torch.no_grad():
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        length = past.get_seq_length()

        def eager():
            past.crop(length)
            model(token, past_key_values=past, use_cache=True)
        return b.torch_ms(eager)


def torch_decode_graph(b: Bench, entry, batch: int) -> float:
    """GPU ms of one decode step in transformers with a static cache,
    captured as a CUDA graph and replayed."""
    torch = b.torch
    model, ids, transformers = torch_decode_model(b, entry, batch)
    prompt = entry["prompt"]
    with torch.no_grad():
        static = transformers.StaticCache(config=model.config, max_cache_len=prompt + 1)
        token = model(ids, past_key_values=static, use_cache=True,
                      cache_position=torch.arange(prompt, device="cuda")).logits[:, -1:].argmax(-1)
        # An error of the prefill's kernels is reported here, not in a
        # later section's call.
        torch.cuda.synchronize()
        position = torch.tensor([prompt], device="cuda")
        return b.torch_ms(lambda: model(token, past_key_values=static, cache_position=position),
                          graph=True)


def bench_decode(b: Bench) -> list[str]:
    entries = variants(b.entries("decode"))
    if not entries:
        return []
    entry = entries["static"]
    config = entry["hf_config"]
    kernels = {s: etc.runtime.load(KIT / e["path"]) for s, e in entries.items()}
    cache = next(a.dtype for a in kernels["static"].arguments if a.kind == "state")
    rows = [f"Model: random Qwen3 (hidden {config['hidden_size']}, {config['num_hidden_layers']} "
            f"layers, vocab {config['vocab_size']}), bf16 weights, {cache} KV cache, "
            f"{entry['prompt']} positions in the cache.", "",
            "| B | " + " | ".join(f"ETC {v} ms" for v in entries)
            + " | ETC static, CUDA graph ms | PyTorch eager ms | PyTorch CUDA graph ms |",
            "|---:|" + "---:|" * (len(entries) + 3)]
    notes = set()
    cells = {}
    # ETC first, then PyTorch's eager steps, then its graphs: a PyTorch
    # error that ends the process's CUDA context (a device-side assert)
    # costs only the PyTorch numbers after it.
    for batch in DECODE_BATCHES:
        row = cells[batch] = [str(batch)]
        graph_ms = None
        for variant, kernel in kernels.items():
            rng = np.random.default_rng(batch)
            inputs = decode_inputs(kernel, entry, batch, rng)
            launch = kernel.runtime.bind(inputs)
            launch.enqueue()
            launch.check()
            b.note(kernel, entries[variant]["path"])
            logits = launch.outputs()[0]
            if not np.all(np.isfinite(logits)) or not np.any(logits):
                raise RuntimeError(f"decode {variant} B={batch}: logits are not finite or all 0")
            row.append(f"{b.timer(launch.enqueue):.3f}")
            if variant == "static":
                graph_ms, note = etc_graph_ms(b, launch)
                notes.add(note)
        row.append(f"{graph_ms:.3f}" if graph_ms else "n/a")
    torch_cells = {batch: ["n/a", "n/a"] for batch in DECODE_BATCHES}
    if not b.torch:
        notes.add("PyTorch: not installed or no GPU")
    elif importlib.util.find_spec("transformers") is None:
        notes.add("PyTorch: transformers not installed")
    else:
        import transformers
        notes.add(f"PyTorch: transformers {transformers.__version__}")
        for column, (kind, step) in enumerate((("eager", torch_decode_eager),
                                                ("CUDA graph", torch_decode_graph))):
            for batch in DECODE_BATCHES:
                try:
                    torch_cells[batch][column] = f"{step(b, entry, batch):.3f}"
                except Exception as error:  # reported; later PyTorch cells stay n/a
                    first = (str(error).strip().splitlines() or [""])[0]
                    notes.add(f"PyTorch {kind} failed at B={batch}: {type(error).__name__}: "
                              f"{first}")
                    break
    for batch in DECODE_BATCHES:
        rows.append("| " + " | ".join(cells[batch] + torch_cells[batch]) + " |")
    return rows + [""] + [f"({note})" for note in sorted(notes) if note]


#: The benchmark sections, in the order they run: key, title, function.
SECTIONS = (
    ("latency", "Notify → wake latency (static chain, one hop per CTA)", bench_latency),
    ("overhead", "Per-task overhead (independent 1-row tiles)", bench_overhead),
    ("gemv", "bf16 GEMV (bytes: weights + x + y)", bench_gemv),
    ("roofline", "Roofline: one line per tile kernel", bench_roofline),
    ("mlp", "5-operator MLP block, bf16", bench_mlp),
    ("decode", "Decode step", bench_decode),
    ("gemm", "bf16 GEMM", bench_gemm),
    ("hopper", "bf16 x·Wᵀ GEMM, known rows (wgmma on sm_90a) vs cuBLAS and a copy", bench_hopper),
    ("prefill", "bf16 prefill x·Wᵀ, symbolic rows (decode-sized column tiles)", bench_prefill),
    ("packed", "Packed weights x·Wᵀ (GGUF block formats) against bf16", bench_packed),
)


# ---------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------

def bench_child(key: str, args, device: Device) -> dict:
    """In a child process: one benchmark section (or the copy bandwidth)."""
    b = Bench(load_manifest(), device, args)
    if key == "copy":
        lines = bench_copy(b)
        return {"lines": lines, "copy_gbs": b.copy_gbs, "resources": []}
    function = next(f for k, _, f in SECTIONS if k == key)
    try:
        lines = function(b)
    except Exception as error:  # reported; the child's context may be gone
        lines = [f"FAILED: {type(error).__name__}: {error}"]
    if b.timer.gap_us > 5:
        lines.append(f"(the last timing's GPU waited {b.timer.gap_us:.0f} µs for the host "
                     "after the spin: its window may hold host time)")
    return {"lines": lines, "resources": b.resources}


def run_benchmarks(manifest, args, device: Device, report: Report) -> None:
    torch = torch_or_none()
    patterns = args.bench.split(",")
    keys = [k for k, _, _ in SECTIONS if any(fnmatch.fnmatch(k, p) for p in patterns)]
    report.add(["## Benchmarks", "",
                f"GPU time: median of {args.repeats} timed runs after 5 warm-ups, between CUDA "
                "events that hold GPU work only (each run queued behind a spin kernel longer "
                "than the host takes to queue it); cold runs follow an L2 flush. Artifacts for "
                f"{best_chip(manifest, device)}; PyTorch "
                f"{torch.__version__ if torch else 'not available'}; a child process per "
                "section.", ""])
    result, text = run_child(["--internal-bench", "copy", *child_options(args)],
                             args.section_timeout)
    if result is None:
        report.add([f"FAILED: the copy bandwidth's child process died: {text}", ""])
        args.copy_gbs = float("nan")
    else:
        args.copy_gbs = result["copy_gbs"]
        report.add(result["lines"] + [""])
    deadline = time.perf_counter() + args.bench_budget
    rows = []
    for key in keys:
        title = next(t for k, t, _ in SECTIONS if k == key)
        if time.perf_counter() > deadline:
            report.add([f"### {title}", "", "skipped: over the --bench-budget of "
                        f"{args.bench_budget:.0f} s", ""])
            continue
        start = time.perf_counter()
        result, text = run_child(["--internal-bench", key, "--copy-gbs", str(args.copy_gbs),
                                  *child_options(args)], args.section_timeout)
        if result is None:
            table = [f"FAILED: the section's child process died: {text}"]
        else:
            table = result["lines"]
            rows += result["resources"]
        report.add([f"### {title}", "", *table, "", f"({time.perf_counter() - start:.0f} s)", ""])
    if rows:
        report.add(resource_table(rows))
