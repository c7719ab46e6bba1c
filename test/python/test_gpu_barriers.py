"""bench/gpu_barriers.py, the check that no kit worker branches straight to a
reducing barrier, on SASS listings written out here (the real run needs
ptxas and cuobjdump; docs/gpu.md, "What the first GPU found")."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "bench" / "gpu_barriers.py"
_SPEC = importlib.util.spec_from_file_location("gpu_barriers", _PATH)
gpu_barriers = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_barriers)

#: The shape the H200 failed on: thread 0 reaches the barrier through its
#: atomic and a reconvergence region, the other threads straight away.
DIVERGED = [(0x5b40, "@P3 BRA 0x5ea0"), (0x5b50, "BRA 0x5d30"),
            (0x5d20, "@P5 BRA 0x5ea0"), (0x5da0, "@P0 ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR16][R2.64], R7"),
            (0x5db0, "BSSY B1, 0x5ea0"), (0x5e90, "BSYNC B1"),
            (0x5ea0, "BAR.RED.OR.DEFER_BLOCKING 0x0, P0"), (0x5ec0, "@!P0 BRA 0x8910")]

#: Straight-line code into the barrier; a loop branches to a BAR.SYNC.
CONVERGED = [(0x0c30, "@!P0 BRA 0x28f0"), (0x28f0, "BAR.SYNC.DEFER_BLOCKING 0x0"),
             (0x5c80, "@P1 ATOMG.E.ADD.STRONG.GPU PT, R2, desc[UR16][R2.64], R5"),
             (0x5cd0, "ISETP.EQ.U32.AND P0, PT, R51, RZ, !P0"),
             (0x5ce0, "BAR.RED.OR.DEFER_BLOCKING 0x0, P0")]


def test_branches_straight_to_a_reducing_barrier_are_found():
    count, found = gpu_barriers.branches_to_reducing_barriers(DIVERGED)
    assert count == 1
    assert found == ["0x5b40: @P3 BRA 0x5ea0", "0x5d20: @P5 BRA 0x5ea0"]


def test_straight_line_code_and_other_barriers_pass():
    assert gpu_barriers.branches_to_reducing_barriers(CONVERGED) == (1, [])


def test_the_listing_parser_keeps_the_named_function():
    listing = """
        Function : a_worker
        /*0000*/                   BAR.RED.OR.DEFER_BLOCKING 0x0, P0 ;   /* 0x0000000000007b1d */
        /*0010*/               @P0 BRA 0x0 ;                             /* 0x0000000000007947 */
        Function : a_check
        /*0000*/                   EXIT ;                                 /* 0x000000000000794d */
    """
    lines = gpu_barriers.function_lines(listing, "a_worker")
    assert lines == [(0, "BAR.RED.OR.DEFER_BLOCKING 0x0, P0"), (0x10, "@P0 BRA 0x0")]
    assert gpu_barriers.branches_to_reducing_barriers(lines) == (1, ["0x10: @P0 BRA 0x0"])
    assert gpu_barriers.function_lines(listing, "a_check") == [(0, "EXIT")]
