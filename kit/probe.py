"""The GPU check kit's probe (--probe): what the static schedule assumes of
the hardware, asked of the driver and of the probe kernels of
`etc.runtime.probes`: which SM each worker CTA lands on and how many are
resident at once, whether a cooperative launch can be captured in a CUDA
graph, and the resolution of %globaltimer.
"""

from __future__ import annotations

import numpy as np

import etc.runtime
from harness import KIT, Device, Report, best_chip, child_options, load_manifest, run_child


def probe_child(args, device: Device) -> dict:
    """In a child process: the answers of the --probe section (see
    `etc.runtime.probes`)."""
    from etc.runtime import probes
    from etc.runtime.cuda import _check, _Parameters, load_module

    d = device.driver
    module, _ = load_module(d, probes.PTX)

    def function(name: str):
        return _check(d, "cuModuleGetFunction", d.cuModuleGetFunction(module, name.encode()))

    def alloc(nbytes: int) -> int:
        pointer = _check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
        _check(d, "cuMemsetD8", d.cuMemsetD8(pointer, 0, nbytes))
        return pointer

    def read(pointer: int, count: int) -> np.ndarray:
        host = np.zeros(count, np.uint64)
        _check(d, "cuMemcpyDtoH", d.cuMemcpyDtoH(host.ctypes.data, pointer, host.nbytes))
        return host

    lines = []
    manifest = load_manifest()
    chip = best_chip(manifest, device)
    entry = next((e for e in manifest["artifacts"] if e["kind"] == "check" and
                  e["schedule"] == "static" and e["chip"] == chip), None)
    kernel = etc.runtime.load(KIT / entry["path"])
    per_sm, lanes = kernel.runtime.ctas_per_sm, kernel.runtime.lanes
    probe_sm = function("etc_probe_sm")

    def occupancy(shared: int) -> int:
        return int(_check(d, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                          d.cuOccupancyMaxActiveBlocksPerMultiprocessor(probe_sm, lanes, shared)))

    # Dynamic shared memory that lets exactly as many probe CTAs share an
    # SM as the worker's occupancy does (the smallest that is not more).
    limit = device.attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    shared = 0
    if occupancy(0) > per_sm:
        low, high = 0, limit
        while high - low > 256:
            middle = (low + high) // 2
            low, high = (middle, high) if occupancy(middle) > per_sm else (low, middle)
        shared = high
        if shared > 48 << 10:
            _check(d, "cuFuncSetAttribute", d.cuFuncSetAttribute(
                probe_sm, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared))
    grid = device.sms * per_sm
    spin_ns = 200_000
    out = alloc(32 * grid)
    parameters = _Parameters([out, spin_ns])
    lines += [f"Worker of {entry['path']}: {lanes} threads, {per_sm} CTAs per SM by the "
              f"occupancy calculator; the probe kernel ran {grid} CTAs ({device.sms} SMs x "
              f"{per_sm}) cooperatively with {shared} bytes of dynamic shared memory "
              f"(occupancy {occupancy(shared)}), each spinning {spin_ns // 1000} us.", ""]
    error = d.cuLaunchCooperativeKernel(probe_sm, grid, 1, 1, lanes, 1, 1, shared, 0,
                                        parameters.pointer_array())[0]
    if error != d.CUresult.CUDA_SUCCESS:
        from etc.runtime.cuda import _error_name

        lines.append(f"- The cooperative launch was refused: {_error_name(d, error)}")
    else:
        _check(d, "cuCtxSynchronize", d.cuCtxSynchronize())
        records = read(out, 4 * grid).reshape(grid, 4)
        sm, start, end = records[:, 0], records[:, 1], records[:, 2]
        first = sm[:device.sms]
        per = np.bincount(sm.astype(np.int64), minlength=device.sms)
        used = per[per > 0]
        lines += [
            f"- CTAs 0..{device.sms - 1} land on {len(set(first.tolist()))} distinct SMs "
            f"(of {device.sms}): {'yes' if len(set(first.tolist())) == device.sms else 'NO'}, "
            "distinct SMs as the static schedule assumes.",
            f"- All {grid} CTAs: {len(used)} SMs used, {int(used.min())} to {int(used.max())} "
            f"CTAs per SM (expected {per_sm} each): "
            f"{'yes' if used.min() == used.max() == per_sm else 'NO'}.",
            f"- Resident at once (every CTA started before any finished): "
            f"{'yes' if start.max() < end.min() else 'NO'} (starts spread over "
            f"{(start.max() - start.min()) / 1000:.1f} us).",
            f"- SM of CTA b for b = 0..15: {sm[:16].astype(int).tolist()}; CTA b on SM "
            f"b mod {device.sms}: {'yes' if np.all(sm == np.arange(grid) % device.sms) else 'no'}"
            f"; %nsmid {int(records[0, 3])}."]
    # A cooperative launch captured in a CUDA graph, then replayed.
    _check(d, "cuMemsetD8", d.cuMemsetD8(out, 0, 32 * grid))
    stream = _check(d, "cuStreamCreate", d.cuStreamCreate(0))
    step = "cuStreamBeginCapture"
    try:
        _check(d, step, d.cuStreamBeginCapture(
            stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        step = "cuLaunchCooperativeKernel (captured)"
        launched = d.cuLaunchCooperativeKernel(probe_sm, grid, 1, 1, lanes, 1, 1, shared,
                                               stream, parameters.pointer_array())
        graph = d.cuStreamEndCapture(stream)
        _check(d, step, launched)
        step = "cuStreamEndCapture"
        graph = _check(d, step, graph)
        step = "cuGraphInstantiate"
        executable = _check(d, step, d.cuGraphInstantiate(graph, 0))
        step = "cuGraphLaunch"
        _check(d, step, d.cuGraphLaunch(executable, stream))
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        ran = int(np.count_nonzero(read(out, 4 * grid).reshape(grid, 4)[:, 1]))
        lines.append(f"- A cooperative launch captured in a CUDA graph: captured, instantiated "
                     f"and replayed; {ran}/{grid} CTAs ran: "
                     f"{'yes' if ran == grid else 'NO'}.")
    except RuntimeError as failure:
        lines.append(f"- A cooperative launch captured in a CUDA graph: NO, {step} failed: "
                     f"{failure}")
    # %globaltimer: consecutive reads on one thread.
    reads = 4096
    times = alloc(8 * reads)
    timer_parameters = _Parameters([times, reads])
    _check(d, "cuLaunchKernel(etc_probe_timer)", d.cuLaunchKernel(
        function("etc_probe_timer"), 1, 1, 1, 1, 1, 1, 0, 0,
        timer_parameters.pointer_array(), 0))
    _check(d, "cuCtxSynchronize", d.cuCtxSynchronize())
    deltas = np.diff(read(times, reads).astype(np.int64))
    steps = deltas[deltas > 0]
    if len(steps):
        lines.append(f"- %globaltimer over {reads} consecutive reads: it advanced "
                     f"{len(steps)} times, by {int(steps.min())} ns at least and "
                     f"{int(np.median(steps))} ns typically (median); "
                     f"{int((deltas == 0).sum())} reads saw no change: a resolution of about "
                     f"{int(np.median(steps))} ns.")
    else:
        lines.append(f"- %globaltimer did not advance over {reads} reads.")
    return {"lines": lines}


def run_probe(args, report: Report) -> None:
    result, text = run_child(["--internal-probe", *child_options(args)], args.section_timeout)
    if result is None:
        report.failed += 1
        report.add(["## Probe", "", f"FAILED: the probe's child process died: {text}", ""])
        return
    report.add(["## Probe: what the static schedule assumes", "", *result["lines"], ""])
