"""Graphs on several ranks, run as real MPI processes on this machine.

Each test starts N processes with `python -m etc.runtime.distributed`'s
launcher (the `mpich` wheel's mpiexec); the per-rank scripts are in
distributed/. They check the fused patterns against NumPy (all_gather +
matmul, matmul + reduce_scatter, matmul + all_reduce, on the static and
the dynamic schedule, 1 and 2 workers per rank), a tensor-parallel model
(dense, and Mixture-of-Experts) against the whole model, that a rank that
dies or hangs is an error on every other rank, not a hang, and the `etc`
command on two ranks (generate, chat, a served model losing a rank)."""

import importlib
import json
import os
import re
import shutil

import pytest

import mpi4py  # noqa: F401,E402  (a test dependency: a broken import fails)

from etc.runtime import distributed  # noqa: E402
from http_servers import listening_port, wait_until_healthy  # noqa: E402

HERE = os.path.join(os.path.dirname(__file__), "distributed")


def _launch(ranks: int, script: str, *args: str, timeout: float = 240,
            env_extra: dict | None = None):
    env = dict(os.environ, ETC_PIN_WORKERS="0", **(env_extra or {}))
    result = distributed.launch(ranks, [os.path.join(HERE, script), *args], timeout=timeout,
                                env=env)
    return result, result.stdout + result.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_fused_collectives_match_numpy(ranks):
    result, output = _launch(ranks, "fused_patterns.py")
    assert result.returncode == 0, output
    for rank in range(ranks):
        assert re.search(rf"rank {rank}: \d+ checks passed \(20 dynamic\)", output), output


@pytest.mark.parametrize("ranks,schedule", [(2, "auto"), (3, "auto"), (2, "dynamic")])
def test_tensor_parallel_model_matches_one_rank(ranks, schedule):
    """etc.models.load(..., tensor_parallel=N) generates the tokens, and
    logits within float rounding, of the whole model on one rank, with the
    step kernel on the static schedule ("auto") or the dynamic one."""
    result, output = _launch(ranks, "tensor_parallel.py", schedule)
    assert result.returncode == 0, output
    for rank in range(ranks):
        assert f"rank {rank}: tensor parallel matches" in output, output


def test_tensor_parallel_moe_matches_one_rank():
    """A Qwen3-MoE model (a dense layer and a sparse one) split over 2 ranks:
    every expert's columns shared out, the router whole, one all_reduce per
    expert layer; it generates the whole model's tokens, with logits within
    float rounding, and an expert width 2 does not divide is an error
    naming moe_intermediate_size."""
    result, output = _launch(2, "tensor_parallel_moe.py")
    assert result.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: tensor parallel MoE matches" in output, output


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("mode", ["die", "hang"])
def test_failing_rank_is_an_error_on_every_rank(mode, schedule):
    """Rank 1 of 3 dies between runs, or hangs inside one (it never sends
    its rows); ranks 0 and 2 raise within the 1 s watchdog plus a
    meeting's timeout instead of hanging. Under the dynamic schedule the
    workers of ranks 0 and 2 poll for the rows, and the watchdog of their
    idle polls names the element still to arrive."""
    result, output = _launch(3, "failing_rank.py", mode, schedule, timeout=120)
    expected = "DistributedError" if mode == "die" else "WatchdogError"
    for rank in (0, 2):
        line = re.search(rf"rank {rank}: (\w+) after ([0-9.]+) s: (.*)", output)
        assert line, output
        assert line.group(1) == expected, output
        assert float(line.group(2)) < 10, output
        if mode == "hang":
            # The stuck wait is named: the matmul's wait for gathered rows.
            assert "task matmul_0 tile (" in line.group(3), output
            assert "all_gather_0" in line.group(3), output
    if mode == "hang":
        # The silent rank finishes its own (different) program at once and
        # waits for the others at the end of the run: it either gives up
        # on them first (its meeting's timeout and their watchdog are both
        # 1 s, a race) or meets them and finds its counters changed by
        # their notifies. Under the dynamic schedule, those notifies can
        # also land on its queue or pending counts (its counter buffer is
        # laid out for another program) while it runs, so that its workers
        # idle until their watchdog. Either way it is an error, never a hang.
        errors = r"DistributedError|RuntimeError after [0-9.]+ s: gather_matmul: unbalanced events"
        if schedule == "dynamic":
            errors += r"|WatchdogError after [0-9.]+ s: gather_matmul: watchdog"
        assert re.search(rf"rank 1: ({errors})", output), output


# ----------------------------------------------------------------------
# The front end, in this process (no MPI)
# ----------------------------------------------------------------------

import etc  # noqa: E402


def _gather_graph(ranks=2, rows=32, tile=None):
    g = etc.Graph("ag", ranks=ranks)
    x = g.input("x", (rows, 16))
    gathered = g.all_gather(x)
    g.output(g.matmul(gathered, g.input("w", (16, 8)), tile=tile))
    return g, gathered


def test_collective_graph_ir():
    g, _ = _gather_graph()
    text = g.to_mlir()
    assert "event.ranks = 2" in text
    assert "{event.intermediate, event.symmetric}" in text
    assert "!event.tensor<2, symmetric>" in text
    assert "(d0, d1)[s0] -> (d1, " in text
    assert "event.put" in text and "event.rank_id" in text
    # The matmul waits on its row block of the gathered rows.
    assert "waits(%" in text and "!event.tensor<2, symmetric> (d0, d1) -> (d0)" in text


def test_collective_errors():
    g = etc.Graph("one")
    x = g.input("x", (32, 16))
    with pytest.raises(ValueError, match="collectives need a graph on several ranks"):
        g.all_gather(x)
    g, gathered = _gather_graph()
    with pytest.raises(ValueError, match="lives in the symmetric heap"):
        g.output(gathered)
    g = etc.Graph("rs", ranks=3)
    with pytest.raises(ValueError, match="static multiple of the 3 ranks"):
        g.reduce_scatter(g.input("y", (32, 16)))
    with pytest.raises(ValueError, match="ranks=0 must be a positive int"):
        etc.Graph("bad", ranks=0)
    g, _ = _gather_graph(tile=(16, 8))
    with pytest.raises(ValueError, match="row blocks of the 32 rows each rank sends"):
        g.to_mlir()


@pytest.mark.skipif(not (shutil.which("ptxas") and shutil.which("nvlink")),
                    reason="needs ptxas and nvlink (CUDA toolkit) on PATH")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_nvshmem_ptx_assembles_and_links(chip, schedule, tmp_path):
    """The CUDA program of a graph on two ranks calls NVSHMEM's device API
    (row puts, the remote atomic notify after a quiet, the PE), assembles
    as relocatable code and links with NVSHMEM's device library (its
    bitcode from the wheel, compiled for the chip) into a cubin, under
    both schedules. Both poll the symmetric elements with relaxed loads
    and acquire with a fence at system scope (other GPUs notify them): the
    static schedule's waits (spinning out of line in
    __etc_spin_counter_system), the dynamic schedule's polling worker,
    which backs off with nanosleep."""
    g, _ = _gather_graph()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule)
    ptx = kernel.ptx
    for call in ("nvshmem_my_pe", "nvshmem_quiet", "nvshmem_int_atomic_add",
                 "nvshmemx_putmem_nbi_block"):
        assert re.search(rf"\.extern \.func .*{call}", ptx), call
    assert re.search(r"ld\.relaxed\.sys\.(global\.)?[bu]32", ptx)
    assert "fence.acq_rel.sys" in ptx
    if schedule == "static":
        assert re.search(r"\.func .*__etc_spin_counter_system\(", ptx)
    else:
        assert "nanosleep.u32" in ptx
    cubin = distributed.link_nvshmem(ptx, chip, str(tmp_path))
    assert cubin[:4] == b"\x7fELF"
    # What the runtime links with at load (and saves in the artifact).
    library = kernel.runtime.library_ptx
    assert re.search(r"\.visible \.const .* nvshmemi_device_state_d\[", library)
    for call in ("nvshmem_quiet", "nvshmem_int_atomic_add", "nvshmemx_putmem_nbi_block"):
        assert re.search(rf"\.visible \.func .*\b{call}\(", library), call


# ----------------------------------------------------------------------
# The NVSHMEM host runtime (CUDA on several ranks), without a GPU
# ----------------------------------------------------------------------

from etc.runtime import artifact, nvshmem  # noqa: E402


def test_symmetric_layout():
    """The counters come first, each intermediate at the next multiple of
    256 bytes, whatever its size; the layout depends on the sizes only."""
    offsets, total = nvshmem.symmetric_layout(10, [("g", 4096), ("staging", 1), ("empty", 0)])
    assert offsets == {"g": 256, "staging": 256 + 4096, "empty": 256 + 4096 + 256}
    assert total == 256 + 4096 + 256 + 256
    assert all(offset % nvshmem.SYMMETRIC_ALIGNMENT == 0 for offset in offsets.values())
    assert nvshmem.symmetric_layout(65, []) == ({}, 512)
    with pytest.raises(ValueError, match="counter_count=0"):
        nvshmem.symmetric_layout(0, [])


def test_nvshmem_runtime_without_a_device():
    """A CUDA kernel on several ranks compiles with the NVSHMEM runtime,
    which touches nothing until it runs; binding it for enqueueing is
    refused (runs meet the other ranks on the host), and without
    nvshmem4py the host library's absence is named with what to install."""
    g, _ = _gather_graph()
    kernel = etc.compile(g, target="cuda", chip="sm_80", schedule="dynamic")
    assert isinstance(kernel.runtime, nvshmem.NVSHMEMRuntime)
    assert kernel.runtime.ranks == 2 and kernel.runtime.comm is None
    with pytest.raises(NotImplementedError, match="cannot be bound .* call run"):
        kernel.runtime.bind({})
    try:
        importlib.import_module("nvshmem.bindings")
    except ImportError:
        with pytest.raises(RuntimeError, match=r"nvshmem4py-cu13==0\.4\.1"):
            nvshmem._bindings()


def test_nvshmem_artifact_carries_the_device_library(tmp_path):
    """A saved CUDA kernel on several ranks holds NVSHMEM's device library
    PTX beside its own (checked by its digest) and loads on the NVSHMEM
    runtime; one without it, or with a damaged one, is refused."""
    g, _ = _gather_graph()
    kernel = etc.compile(g, target="cuda", chip="sm_80")
    library = b"// NVSHMEM's device library stands here\n"
    path = tmp_path / "ag.etc"
    artifact.write(path, kernel.abi, kernel.ptx.encode(), library=library)
    loaded = etc.runtime.load(path)
    assert isinstance(loaded.runtime, nvshmem.NVSHMEMRuntime)
    assert loaded.runtime.library_ptx == library.decode()
    loaded.save(tmp_path / "again.etc")
    assert etc.runtime.load(tmp_path / "again.etc").runtime.library_ptx == library.decode()
    with pytest.raises(ValueError, match="needs NVSHMEM's device library"):
        artifact.write(tmp_path / "none.etc", kernel.abi, kernel.ptx.encode())
    data = path.read_bytes().replace(b"stands here", b"stands HERE")
    (tmp_path / "damaged.etc").write_bytes(data)
    with pytest.raises(artifact.ArtifactError, match=r"is damaged: .*(nvshmem\.ptx|device library)"):
        etc.runtime.load(tmp_path / "damaged.etc")


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_nvshmem_runtime_on_the_fake_driver(schedule, tmp_path):
    """Two MPI processes run CUDA programs on several ranks through the
    NVSHMEM runtime on the fake CUDA driver and fake NVSHMEM: bootstrap,
    symmetric block, link, module initialisation, meetings and checks as
    on GPUs, the kernels played by the CPU build of the same program over
    an MPI window, every put held until its CTA's flush; all_gather +
    matmul and matmul + reduce_scatter match NumPy, also saved and loaded,
    and on a non-blocking stream with a new symmetric block (whose zeroing
    once raced with the stream's g_init). A program without the quiet
    before its notifies (flushes that deliver nothing) faults, saying that
    the notify overtook the puts."""
    result, output = _launch(2, "nvshmem_fake.py", schedule, env_extra={"ETC_TEST_DIR": str(tmp_path)})
    assert result.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: nvshmem fake: 6 checks passed" in output, output
        assert f"rank {rank}: without quiet: RuntimeError: kernel execution (ag_mm_worker) " \
            "failed: CUDA_ERROR_LAUNCH_FAILED" in output, output
    assert "puts of the same CTA to that rank were not completed (no nvshmem_quiet between " \
        "them): the notify may overtake the data" in output, output


def test_fake_nvshmem_holds_the_program_to_nvshmem_rules(tmp_path):
    """The fake NVSHMEM refuses what NVSHMEM on GPUs would trip over: a
    collective whose source or destination is private memory or runs past
    its symmetric block, a second free, a put outside the heap, a notify
    that overtakes its CTA's puts and puts never completed; and a
    collective on a non-blocking stream has not run when its result is
    read without waiting for the stream (the old values come back, and the
    wait then reports the race)."""
    result, output = _launch(2, "nvshmem_fake.py", "static", "rules",
                             env_extra={"ETC_TEST_DIR": str(tmp_path)})
    assert result.returncode == 0, output
    symmetric = "does not lie in one block of the symmetric heap"
    for rank in range(2):
        said = json.loads((tmp_path / f"rules-{rank}.json").read_text())
        for what in ("fcollect from private memory", "fcollect into private memory",
                     "reduce-scatter past its block"):
            assert said[what].startswith("NvshmemError: ") and symmetric in said[what], said
        assert "freed already" in said["a second free"], said
        assert said["a put outside the heap"] == "status 12", said
        violations = said["violations"]
        assert len(violations) == 3, violations
        assert "a put of 16 bytes" in violations[0] and \
            "outside every block of the symmetric heap" in violations[0]
        assert "a notify of rank" in violations[1] and \
            "not completed (no nvshmem_quiet between them)" in violations[1]
        assert "the worker ended with 1 puts never completed" in violations[2]
        ones, twos = [1] * 8, [2] * 8
        assert said["after the stream"] == ones + twos, said
        assert said["without waiting"] == ones + twos, said  # not 7s and 14s yet
        assert said["the wait after the early read"].startswith(
            "RaceError: fake CUDA driver: a race: cuMemcpyDtoH on the legacy stream and "
            "nvshmemx_bfloat16_fcollect_on_stream"), said


# ----------------------------------------------------------------------
# Serving a tensor-parallel model
# ----------------------------------------------------------------------


def test_serve_tensor_parallel_answers_the_openai_client(tmp_path):
    """`etc serve --tensor-parallel 2` as two MPI processes on a free local
    port: rank 0 serves, rank 1 runs its steps; the openai client's chat
    completions (alone, streamed, two at once, one whose prompt blocks come
    from the prefix cache) get the text the whole model generates on one
    rank, and SIGTERM ends both ranks."""
    import openai
    import subprocess
    import sys
    import threading

    import etc.models
    from etc.models.testing import tiny_config, write_checkpoint

    path = write_checkpoint(tmp_path / "tiny-chat", tiny_config(vocab_size=320), tokenizer=True)
    small = ["--max-model-len", "64", "--attention-chunk", "16"]
    whole = etc.models.load(path, workers=1, max_seq_len=64, attention_chunk=16, cache=False)
    etc_script = os.path.join(os.path.dirname(sys.executable), "etc")
    server = subprocess.Popen(
        distributed.command(2, [etc_script, "serve", str(path), "--tensor-parallel", "2",
                                "--port", "0", "--max-num-seqs", "2",
                                "--kv-cache-tokens", "192", "--no-cache", "--workers", "1",
                                *small]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=distributed.environment(dict(os.environ, ETC_PIN_WORKERS="0")))
    try:
        port = listening_port(server)
        wait_until_healthy(server, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0)
        name = client.models.list().data[0].id

        def chat(content: str, **options):
            return client.chat.completions.create(
                model=name, max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": content}], **options)

        def want(content: str) -> str:
            return whole.generate([{"role": "user", "content": content}], 6,
                                  ignore_eos=True).text[0]

        assert chat("hi there").choices[0].message.content == want("hi there")
        stream = chat("tell me more", stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
            want("tell me more")
        # Two at once: steps that batch both sequences.
        prompts = ["the quick brown fox", "jumps over the lazy dog"]
        replies = [None, None]
        threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, chat(prompts[i])))
                   for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [r.choices[0].message.content for r in replies] == [want(p) for p in prompts]
        # A prompt of several 16-position blocks, twice: the second takes
        # its full blocks but the last position's from the cache (rank 0's
        # block tables, rank 1's own KV blocks) and gives the same text.
        long = "please write several words about rivers and mountains"
        tokenizer = whole.tokenizer
        length = len(tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": long}]), add_special_tokens=False))
        assert length > 16
        again = [chat(long) for _ in range(2)]
        assert [r.usage.prompt_tokens_details.cached_tokens for r in again] == \
            [0, (length - 1) // 16 * 16]
        assert {r.choices[0].message.content for r in again} == {want(long)}
    finally:
        server.terminate()
        try:
            output = server.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
    assert "step failed" not in output, output


# ----------------------------------------------------------------------
# The command line on several ranks: etc generate / chat / serve
# --tensor-parallel 2, which start the ranks themselves
# ----------------------------------------------------------------------

#: The small kernel the command-line tests share (compiled once per cache).
CLI_SMALL = ["--workers", "1", "--max-model-len", "32", "--attention-chunk", "8"]


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory):
    """A tiny Qwen3 with a tokenizer and chat template, its one-rank model
    (the reference), and a compile cache that the first two-rank command
    fills with the shard's kernel for the others."""
    import etc.models
    from etc.models.testing import tiny_config, write_checkpoint

    root = tmp_path_factory.mktemp("tp-cli")
    path = write_checkpoint(root / "tiny-chat", tiny_config(vocab_size=320), tokenizer=True)
    cache = root / "cache"
    whole = etc.models.load(path, workers=1, max_seq_len=32, attention_chunk=8, cache=cache)
    return path, cache, whole


def _etc(*args, stdin=None, timeout=300):
    """Runs the installed `etc` command as a user does."""
    import subprocess
    import sys

    etc_script = os.path.join(os.path.dirname(sys.executable), "etc")
    return subprocess.run([etc_script, *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout,
                          env=dict(os.environ, ETC_PIN_WORKERS="0"))


def test_generate_and_chat_on_two_ranks_print_one_ranks_text(cli_checkpoint):
    """`etc generate` and `etc chat` with --tensor-parallel 2, run plainly:
    they start two MPI ranks themselves, rank 0 alone prints, and the text
    is the one-rank model's (greedy)."""
    path, cache, whole = cli_checkpoint
    result = _etc("generate", path, "the quick brown", "--max-new-tokens", "6",
                  "--tensor-parallel", "2", "--cache-dir", cache, *CLI_SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    want = whole.generate("the quick brown", 6).text[0]
    assert result.stdout == want + ("" if want.endswith("\n") else "\n"), result.stderr
    chat = _etc("chat", path, "--max-new-tokens", "4", "--tensor-parallel", "2",
                "--cache-dir", cache, *CLI_SMALL, stdin="hi there\n\n/reset\nthe lazy dog\n")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    first = whole.generate([{"role": "user", "content": "hi there"}], 4).text[0]
    second = whole.generate([{"role": "user", "content": "the lazy dog"}], 4).text[0]
    assert chat.stdout == f"{first}\n{second}\n", chat.stderr


def test_tensor_parallel_needs_as_many_mpi_ranks(cli_checkpoint):
    """Under mpiexec, the job must have --tensor-parallel ranks."""
    import subprocess

    path, cache, _ = cli_checkpoint
    result = subprocess.run(
        distributed.command(1, ["-m", "etc.cli", "generate", str(path), "hi",
                                "--tensor-parallel", "2", "--cache-dir", str(cache),
                                *CLI_SMALL]),
        capture_output=True, text=True, timeout=120, env=distributed.environment())
    assert result.returncode != 0
    assert "--tensor-parallel 2, but this process is one of 1 MPI ranks" in result.stderr, \
        result.stdout + result.stderr


def _descendants(root: int) -> list:
    """The pids of the processes below `root` (MPICH's launcher puts the
    ranks in process groups of their own)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                kids = [int(k) for k in children.read().split()]
        except OSError:
            continue
        found += kids
        todo += kids
    return found


def _rank_process(root: int, rank: int):
    """The pid of the Python process of `rank` among the descendants of
    process `root` (MPICH's launcher sets PMI_RANK)."""
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                env = environ.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv0 = os.path.basename(cmdline.read().split(b"\0")[0])
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env and argv0.startswith(b"python"):
            return pid
    return None


@pytest.mark.parametrize("signal_name,rank", [("SIGKILL", 0), ("SIGSTOP", 0), ("SIGKILL", 1),
                                              ("SIGTERM", None)])
def test_a_lost_rank_ends_the_server_with_an_error_naming_it(cli_checkpoint, signal_name,
                                                             rank):
    """`etc serve --tensor-parallel 2`, idle: rank 0 (the leader) killed,
    or stopped (a hang), or rank 1 (a follower) killed. The survivor says
    which rank was lost, and the whole job exits non-zero within seconds
    (a dead rank on this machine at once; a hung one after --rank-timeout
    2 s without a heartbeat), instead of waiting for it forever. SIGTERM
    to the command (rank None) stops every rank cleanly instead."""
    import signal
    import subprocess
    import sys
    import time

    path, cache, _ = cli_checkpoint
    etc_script = os.path.join(os.path.dirname(sys.executable), "etc")
    server = subprocess.Popen(
        [etc_script, "serve", str(path), "--tensor-parallel", "2", "--port", "0",
         "--cache-dir", str(cache), "--rank-timeout", "2", *CLI_SMALL],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, ETC_PIN_WORKERS="0"))
    victim = None
    ranks = []
    try:
        port = listening_port(server)
        wait_until_healthy(server, port, poll=0.3)
        ranks = _descendants(server.pid)
        victim = server.pid if rank is None else _rank_process(server.pid, rank)
        assert victim is not None
        start = time.monotonic()
        os.kill(victim, getattr(signal, signal_name))
        output = server.communicate(timeout=60)[0]
        seconds = time.monotonic() - start
    finally:
        for pid in [server.pid, *ranks]:  # whatever is left, if the test failed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.communicate()
    if rank is None:
        assert server.returncode == 0, output
        assert "error" not in output and seconds < 10, (seconds, output)
        return
    assert server.returncode != 0, output
    name = "rank 0 (the leader)" if rank == 0 else "rank 1 (a follower)"
    reporter = "etc: rank 1: error: " if rank == 0 else "etc: error: "
    lost = "sent no heartbeat for" if signal_name == "SIGSTOP" else \
        f"died (process {victim} is gone)"
    assert f"{reporter}{name} {lost}" in output, output
    assert seconds < (10 if signal_name == "SIGSTOP" else 5), (seconds, output)
