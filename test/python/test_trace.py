"""Traces: one record per tile task, on one clock, in dependency order;
Perfetto JSON and a Gantt chart; untraced kernels have no trace code."""

from __future__ import annotations

import json

import numpy as np
import pytest

import etc


def _graph() -> etc.Graph:
    g = etc.Graph("traced")
    B = g.symbol("B")
    x = g.input("x", (B, 64), "f32")
    w = g.input("w", (64, 128), "f32")
    # silu's tile given (the CPU would otherwise widen it to the whole
    # row): grids (rows, 2), tile (i, j) -> (i, j)
    a = g.silu(g.matmul(x, w), tile=(32, 64))
    g.output(g.sum(a))                   # grid (rows,): row block i reads a[i, :]
    return g


def _inputs(rows: int):
    rng = np.random.default_rng(rows)
    return {"x": rng.standard_normal((rows, 64)).astype(np.float32),
            "w": (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)}


def _check_trace(trace, rows: int, workers: int) -> None:
    blocks = -(-rows // 32)
    expected = ({("matmul_0", (i, j)) for i in range(blocks) for j in range(2)}
                | {("silu_0", (i, j)) for i in range(blocks) for j in range(2)}
                | {("sum_0", (i,)) for i in range(blocks)})
    seen = [(e.task, e.tile) for e in trace.events]
    assert len(seen) == len(expected) and set(seen) == expected  # one record per tile task
    by_tile = {(e.task, e.tile): e for e in trace.events}
    for e in trace.events:
        assert 0 <= e.worker < workers and 0 < e.start <= e.end
    # A consumer tile never starts before the producer tiles it reads ended.
    for i in range(blocks):
        for j in range(2):
            assert by_tile[("silu_0", (i, j))].start >= by_tile[("matmul_0", (i, j))].end
        assert by_tile[("sum_0", (i,))].start >= max(
            by_tile[("silu_0", (i, j))].end for j in range(2))


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_one_record_per_tile_task_in_dependency_order(schedule):
    g = _graph()
    kernel = etc.compile(g, schedule=schedule, workers=3, trace=True)
    for rows in (1, 70, 130):
        inputs = _inputs(rows)
        (y,) = kernel.run(**inputs)
        np.testing.assert_allclose(y, etc.reference.evaluate(g, **inputs)[0], rtol=1e-4,
                                   atol=1e-4)
        _check_trace(kernel.trace, rows, 3)


def test_perfetto_json_and_png(tmp_path):
    kernel = etc.compile(_graph(), workers=2, trace=True)
    kernel.run(**_inputs(100))
    kernel.trace.save_perfetto(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    tiles = [r for r in data["traceEvents"] if r["ph"] == "X"]
    assert len(tiles) == len(kernel.trace.events) == 4 * 2 + 4 * 2 + 4
    assert {r["tid"] for r in tiles} <= {0, 1}
    tracks = {r["tid"]: r["args"]["name"] for r in data["traceEvents"]
              if r.get("name") == "thread_name"}
    assert tracks == {0: "worker 0", 1: "worker 1"}
    assert min(r["ts"] for r in tiles) == 0 and all(r["dur"] >= 0 for r in tiles)
    kernel.trace.save_png(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loaded_artifacts_trace(tmp_path):
    kernel = etc.compile(_graph(), schedule="dynamic", workers=2, trace=True)
    kernel.save(tmp_path / "t.etc")
    loaded = etc.runtime.load(tmp_path / "t.etc")
    assert loaded.abi.trace
    loaded.run(**_inputs(40))
    _check_trace(loaded.trace, 40, 2)


def test_untraced_kernels_have_no_trace_code():
    kernel = etc.compile(_graph(), workers=2)
    assert "event.trace_begin" not in kernel.ir("scheduled")
    assert "trace_begin" in etc.compile(_graph(), workers=2, trace=True).ir("scheduled")
    kernel.run(**_inputs(8))
    with pytest.raises(RuntimeError, match="compiled without traces"):
        kernel.trace
