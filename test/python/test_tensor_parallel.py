"""Tensor-parallel models on several ranks, run as real MPI processes on
this machine: `etc.models.load(..., tensor_parallel=N)` (dense,
Mixture-of-Experts, gpt-oss, OLMo's whole-projection q/k norms) against the
whole model on one rank, `etc serve --tensor-parallel 2` answering the
openai client, the `etc` command on two ranks (generate, chat), and a
served model losing a rank."""

import os

import pytest

import mpi4py  # noqa: F401,E402  (a test dependency: a broken import fails)

from etc.runtime import distributed  # noqa: E402
from http_servers import listening_port, wait_until_healthy  # noqa: E402
from mpi_ranks import launch  # noqa: E402


@pytest.mark.parametrize("ranks,schedule", [(2, "auto"), (3, "auto"), (2, "dynamic")])
def test_tensor_parallel_model_matches_one_rank(ranks, schedule):
    """etc.models.load(..., tensor_parallel=N) generates the tokens, and
    logits within float rounding, of the whole model on one rank, with the
    step kernel on the static schedule ("auto") or the dynamic one."""
    result, output = launch(ranks, "tensor_parallel.py", schedule)
    assert result.returncode == 0, output
    for rank in range(ranks):
        assert f"rank {rank}: tensor parallel matches" in output, output


def test_tensor_parallel_moe_matches_one_rank():
    """A Qwen3-MoE model (a dense layer and a sparse one) split over 2 ranks:
    every expert's columns shared out, the router whole, one all_reduce per
    expert layer; it generates the whole model's tokens, with logits within
    float rounding, and an expert width 2 does not divide is an error
    naming moe_intermediate_size."""
    result, output = launch(2, "tensor_parallel_moe.py")
    assert result.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: tensor parallel MoE matches" in output, output


def test_tensor_parallel_olmo_matches_one_rank():
    """OLMo 2, OLMo 3 and OLMoE (q/k norms over the whole projections)
    split over 2 ranks: each rank's sums of squares of q and k added by one
    all_reduce per layer, computed in bf16, OLMo 2 on the dynamic
    schedule, and from Q8_0 GGUF files kept packed, match the model on one
    rank (bf16: the first tokens, logits within a relative 2e-2 while the
    tokens agree; the others: the tokens, logits within 1e-4)."""
    result, output = launch(2, "tensor_parallel_olmo.py")
    assert result.returncode == 0, output
    for rank in range(2):
        for name, case in (("olmo2", "bf16"), ("olmo3", "bf16"), ("olmoe", "bf16"),
                           ("olmo2", "dynamic"), ("olmo2", "gguf"), ("olmoe", "gguf")):
            assert f"rank {rank}: tensor parallel {name} {case} matches" in output, output


def test_tensor_parallel_keeps_quantized_weights_packed():
    """GGUF files in Q8_0 (a MoE model) and Q4_K and an FP8 checkpoint split
    over 2 ranks keep their blocks (each rank its rows, or its K blocks of
    the output and down projections) and generate the tokens of the model
    packed on one rank, logits within float rounding; a down projection
    whose K share is not whole Q4_K blocks stays packed, its width split in
    whole blocks and padded with zeros, and an output projection whose K
    share (by heads) is not is widened on every rank with packed=None (a
    warning names it) and refused with packed=True."""
    result, output = launch(2, "tensor_parallel_packed.py")
    assert result.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: tensor parallel packed matches" in output, output


@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "q6_k", "fp8_e4m3", "mxfp4"])
def test_packed_shards_are_the_widened_shards(fmt):
    """A packed weight's share of a rank (its rows, or its K blocks of a
    row-parallel weight, the experts' in their (E, out, in) layout)
    dequantizes to that rank's share of the widened weight; a split of K
    that is not whole blocks is named, for every kind of row-parallel
    weight (no processes: `shard_weight` and `unaligned_packed`)."""
    import numpy as np

    from etc import packed
    from etc.models.loading.config import ModelConfig
    from etc.models.step.parallel import padded_blocks, shard_weight, unaligned_packed
    from etc.models.testing import tiny_config

    config = ModelConfig.from_dict(tiny_config(
        "Qwen3MoeForCausalLM", hidden_size=256, intermediate_size=512, head_dim=128,
        moe_intermediate_size=512, mlp_only_layers=[0]))
    rng = np.random.default_rng(0)
    # Packed and widened alike: projections (out, in), experts (E, out, in).
    shapes = {"l0_wq": (512, 256), "l0_wo": (256, 512), "l0_w_down": (256, 512),
              "l1_experts_up": (4, 512, 256), "l1_experts_down": (4, 256, 512)}
    for name, shape in shapes.items():
        raw = packed.quantize(rng.standard_normal(shape).astype(np.float32), fmt)
        widened = packed.dequantize(raw, fmt)
        for rank in range(2):
            part = packed.dequantize(shard_weight(config, name, raw, 2, rank, fmt), fmt)
            want = shard_weight(config, name, widened, 2, rank)
            np.testing.assert_array_equal(part, want, err_msg=f"{fmt} {name} rank {rank}")
    formats = dict.fromkeys([*shapes, "l1_experts_gate", "embed"], fmt)
    block = packed.FORMATS[fmt].block
    # 512 / 2 is whole blocks of every format; 512 / 4 is not of 256: the
    # MLP widths are then padded to whole blocks; the output projection's
    # K, split by heads (one of 128 per rank), is widened.
    assert unaligned_packed(config, formats, 2) == {}
    widened = unaligned_packed(config, formats, 4)
    if block == 256:
        assert padded_blocks(config, formats, 4) == {"intermediate_size": 256,
                                                     "moe_intermediate_size": 256}
        assert set(widened) == {"l0_wo"}, widened
        assert "'l0_wo' (" + fmt + ", blocks of 256 values)" in widened["l0_wo"]
        assert "tensor_parallel=4" in widened["l0_wo"]
    else:
        assert padded_blocks(config, formats, 4) == {}
        assert widened == {}


@pytest.mark.parametrize("fmt,blocks,ranks", [("mxfp4", 90, 4), ("mxfp4", 90, 8),
                                              ("q8_0", 6, 4), ("q4_k", 3, 2)])
def test_padded_shards_add_up_to_the_whole_mlp(fmt, blocks, ranks):
    """An MLP width whose share per rank is not whole blocks of its packed
    down projection (gpt-oss's 2880 = 90 MXFP4 blocks over 4 or 8 ranks)
    is split in whole blocks, each rank's share padded with zero columns:
    every packed shard dequantizes to its rank's columns of the widened
    weight then zeros, the shard config carries the padded width, and the
    ranks' partial MLP outputs (a dense SiLU MLP, a layer of experts) add
    up to the whole layer's."""
    import numpy as np

    from etc import packed
    from etc.models.loading.config import ModelConfig
    from etc.models.step.parallel import (padded_blocks, shard_config, shard_weight,
                                          unaligned_packed)
    from etc.models.testing import tiny_config
    from etc.reference import moe

    # The padding: a block of zero bytes is zero in every format.
    for name, f in packed.FORMATS.items():
        assert not packed.dequantize(np.zeros((2, f.nbytes), np.uint8), name).any(), name
    block = packed.FORMATS[fmt].block
    width, hidden = blocks * block, 256 if block == 256 else 32
    config = ModelConfig.from_dict(tiny_config(
        "Qwen3MoeForCausalLM", hidden_size=hidden, intermediate_size=width, num_experts=2,
        num_experts_per_tok=2, moe_intermediate_size=width, mlp_only_layers=[0],
        num_attention_heads=8, num_key_value_heads=8))
    shapes = {"l0_w_gate": (width, hidden), "l0_w_up": (width, hidden),
              "l0_w_down": (hidden, width), "l1_experts_gate": (2, width, hidden),
              "l1_experts_up": (2, width, hidden), "l1_experts_down": (2, hidden, width)}
    formats = dict.fromkeys(shapes, fmt)
    padding = padded_blocks(config, formats, ranks)
    assert padding == {"intermediate_size": block, "moe_intermediate_size": block}
    assert unaligned_packed(config, formats, ranks) == {}
    share = -(-blocks // ranks) * block  # whole blocks, the last ranks' padded
    shard = shard_config(config, ranks, padding)
    assert (shard.intermediate_size, shard.moe_intermediate_size) == (share, share)
    assert shard_config(config, ranks).intermediate_size == width // ranks  # unpadded
    rng = np.random.default_rng(1)
    raw = {k: packed.quantize(rng.standard_normal(v).astype(np.float32), fmt)
           for k, v in shapes.items()}
    whole = {k: packed.dequantize(v, fmt) for k, v in raw.items()}
    shards = []
    for rank in range(ranks):
        mine = {}
        for name in shapes:
            part = shard_weight(config, name, raw[name], ranks, rank, fmt, padding)
            mine[name] = packed.dequantize(part, fmt)
            np.testing.assert_array_equal(
                mine[name], shard_weight(config, name, whole[name], ranks, rank, None, padding))
        # Rank r's real columns, then zeros up to the share.
        columns = slice(min(rank * share, width), min((rank + 1) * share, width))
        real = columns.stop - columns.start
        assert mine["l1_experts_down"].shape == (2, hidden, share)
        np.testing.assert_array_equal(mine["l1_experts_down"][:, :, :real],
                                      whole["l1_experts_down"][:, :, columns])
        np.testing.assert_array_equal(mine["l0_w_gate"][:real], whole["l0_w_gate"][columns])
        assert not mine["l1_experts_down"][:, :, real:].any()
        assert not mine["l0_w_gate"][real:].any() and not mine["l0_w_up"][real:].any()
        shards.append(mine)
    assert not shards[-1]["l0_w_down"][:, width - (ranks - 1) * share:].any()
    x = rng.standard_normal((3, hidden)).astype(np.float32)

    def dense(w):
        gate = x @ w["l0_w_gate"].T
        return (gate / (1 + np.exp(-gate)) * (x @ w["l0_w_up"].T)) @ w["l0_w_down"].T

    def experts(w):
        return moe(x, np.ones((hidden, 2), np.float32), w["l1_experts_gate"].swapaxes(1, 2),
                   w["l1_experts_down"].swapaxes(1, 2), 2, w["l1_experts_up"].swapaxes(1, 2))

    for layer in (dense, experts):
        want = layer(whole)
        np.testing.assert_allclose(sum(layer(w) for w in shards), want, rtol=1e-4,
                                   atol=1e-4 * float(np.abs(want).max()))


def test_padded_shared_expert_adds_up_to_the_whole_mlp():
    """A shared expert's width (96: 3 Q8_0 blocks, 48 per rank on 2) pads
    like a dense MLP's: 2 blocks per rank, rank 1's second zeros; the
    ranks' partial outputs add up to the whole shared expert's."""
    import numpy as np

    from etc import packed
    from etc.models.loading.config import ModelConfig
    from etc.models.step.parallel import padded_blocks, shard_config, shard_weights
    from etc.models.testing import tiny_config

    config = ModelConfig.from_dict(tiny_config(
        "Qwen2MoeForCausalLM", shared_expert_intermediate_size=96, moe_intermediate_size=64))
    shapes = {"l0_shexp_gate": (96, 32), "l0_shexp_up": (96, 32), "l0_shexp_down": (32, 96)}
    formats = dict.fromkeys(shapes, "q8_0")
    padding = padded_blocks(config, formats, 2)
    assert padding == {"shared_expert_intermediate_size": 32}
    assert shard_config(config, 2, padding).shared_expert_intermediate_size == 64
    rng = np.random.default_rng(2)
    raw = {k: packed.quantize(rng.standard_normal(v).astype(np.float32), "q8_0")
           for k, v in shapes.items()}
    whole = {k: packed.dequantize(v, "q8_0") for k, v in raw.items()}
    shards = [{k: packed.dequantize(v, "q8_0") for k, v in
               shard_weights(config, raw, 2, rank, formats, padding).items()} for rank in (0, 1)]
    assert shards[1]["l0_shexp_down"].shape == (32, 64)
    assert not shards[1]["l0_shexp_down"][:, 32:].any()
    x = rng.standard_normal((3, 32)).astype(np.float32)

    def mlp(w):
        gate = x @ w["l0_shexp_gate"].T
        return (gate / (1 + np.exp(-gate)) * (x @ w["l0_shexp_up"].T)) @ w["l0_shexp_down"].T

    np.testing.assert_allclose(sum(mlp(w) for w in shards), mlp(whole), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ranks,cases", [
    (2, ("float", "mxfp4")), (2, ("gguf",)), (2, ("mxfp4-padded", "gguf-padded")),
    (4, ("mxfp4-padded",))])
def test_tensor_parallel_gptoss_matches_one_rank(ranks, cases):
    """gpt-oss split over 2 ranks (each its heads' sinks, the o_proj bias
    after the all-reduce, the experts' down bias in rank 0's partial sum)
    generates the whole model's tokens, logits within float rounding: a
    float checkpoint, MXFP4 experts kept packed, and a GGUF file (MXFP4
    experts, Q8_0 projections); with an expert width of 5 MXFP4 blocks
    over 2 and 4 ranks, the experts packed in whole blocks per rank,
    padded with zero columns."""
    result, output = launch(ranks, "tensor_parallel_gptoss.py", *cases)
    assert result.returncode == 0, output
    for rank in range(ranks):
        for case in cases:
            assert f"rank {rank}: tensor parallel gpt-oss {case} matches" in output, output


def test_gptoss_shards_add_up_to_the_whole_layer():
    """gpt-oss's weights over 2 ranks (no processes): each rank's sinks are
    its query heads'; the router, its bias and the o_proj bias are whole;
    the gate and up experts and their biases split along F; the experts'
    down bias is rank 0's alone, so the ranks' partial MoE outputs
    (`etc.reference.moe`) add up to the whole layer's, where a bias on
    every rank would count it twice. MXFP4 experts whose F share is not
    whole blocks of 32 split in whole blocks over 4 ranks, padded with
    zero columns (rows, biases), and still add up to the whole layer."""
    import numpy as np

    from etc.models.loading.config import ModelConfig
    from etc.models.step.parallel import (padded_blocks, shard_config, shard_weights,
                                          unaligned_packed)
    from etc.models.testing import tiny_config
    from etc.reference import moe

    config = ModelConfig.from_dict(tiny_config("GptOssForCausalLM", intermediate_size=64))
    e, f, h, heads = config.num_experts, config.moe_intermediate_size, config.hidden_size, \
        config.num_heads
    rng = np.random.default_rng(0)
    shapes = {"l0_sinks": (heads,), "l0_bo": (h,), "l0_router": (h, e), "l0_router_b": (e,),
              "l0_experts_gate": (e, f, h), "l0_experts_up": (e, f, h),
              "l0_experts_down": (e, h, f), "l0_experts_gate_b": (e, f),
              "l0_experts_up_b": (e, f), "l0_experts_down_b": (e, h)}
    whole = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    x = rng.standard_normal((5, h)).astype(np.float32)

    def layer(w, down_b):
        return moe(x, w["l0_router"], w["l0_experts_gate"].swapaxes(1, 2),
                   w["l0_experts_down"].swapaxes(1, 2), config.num_experts_per_tok,
                   w["l0_experts_up"].swapaxes(1, 2), router_b=w["l0_router_b"],
                   b1=w["l0_experts_gate_b"], b_up=w["l0_experts_up_b"], b2=down_b,
                   activation="swiglu_oai", swiglu_limit=config.swiglu_limit,
                   swiglu_alpha=config.swiglu_alpha)

    shards = [shard_weights(config, whole, 2, rank) for rank in range(2)]
    for rank, shard in enumerate(shards):
        mine = slice(rank * heads // 2, (rank + 1) * heads // 2)
        np.testing.assert_array_equal(shard["l0_sinks"], whole["l0_sinks"][mine])
        for key in ("l0_bo", "l0_router", "l0_router_b"):
            np.testing.assert_array_equal(shard[key], whole[key])
        columns = slice(rank * f // 2, (rank + 1) * f // 2)
        for key in ("l0_experts_gate_b", "l0_experts_up_b"):
            np.testing.assert_array_equal(shard[key], whole[key][:, columns])
        np.testing.assert_array_equal(shard["l0_experts_down"],
                                      whole["l0_experts_down"][:, :, columns])
    assert not shards[1]["l0_experts_down_b"].any()
    want = layer(whole, whole["l0_experts_down_b"])
    got = sum(layer(shard, shard["l0_experts_down_b"]) for shard in shards)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    twice = sum(layer(shard, whole["l0_experts_down_b"]) for shard in shards)
    assert np.abs(twice - want).max() > 0.1
    # 160 / 4 values of the down experts' K per rank are not whole MXFP4
    # blocks: 2 blocks per rank, rank 2's half padding, rank 3's all; the
    # padded columns' clamped SwiGLU is 0 (gate and up and their biases 0).
    formats = {f"l0_experts_{p}": "mxfp4" for p in ("gate", "up", "down")}
    assert unaligned_packed(config, formats, 2) == {} == padded_blocks(config, formats, 2)
    wide = ModelConfig.from_dict(tiny_config("GptOssForCausalLM", intermediate_size=160,
                                             num_key_value_heads=4))
    padding = padded_blocks(wide, formats, 4)
    assert padding == {"moe_intermediate_size": 32}
    assert unaligned_packed(wide, formats, 4) == {}
    assert shard_config(wide, 4, padding).moe_intermediate_size == 64
    shapes.update(l0_experts_gate=(e, 160, h), l0_experts_up=(e, 160, h),
                  l0_experts_down=(e, h, 160), l0_experts_gate_b=(e, 160),
                  l0_experts_up_b=(e, 160))
    whole = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    shards = [shard_weights(wide, whole, 4, rank, padding=padding) for rank in range(4)]
    for rank, shard in enumerate(shards):
        real = (64, 64, 32, 0)[rank]
        for key in ("l0_experts_gate_b", "l0_experts_up_b"):
            np.testing.assert_array_equal(shard[key][:, :real],
                                          whole[key][:, rank * 64:rank * 64 + real])
            assert not shard[key][:, real:].any()
        assert shard["l0_experts_down"].shape == (e, h, 64)
        assert not shard["l0_experts_down"][:, :, real:].any()
    want = layer(whole, whole["l0_experts_down_b"])
    got = sum(layer(shard, shard["l0_experts_down_b"]) for shard in shards)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------
# Serving a tensor-parallel model
# ----------------------------------------------------------------------


def test_serve_tensor_parallel_answers_the_openai_client(tmp_path):
    """`etc serve --tensor-parallel 2` as two MPI processes on a free local
    port: rank 0 serves, rank 1 runs its steps; the openai client's chat
    completions (alone, streamed, constrained by a JSON schema, two at
    once, one whose prompt blocks come from the prefix cache) get the text
    the whole model generates on one rank, and SIGTERM ends both ranks."""
    import openai
    import subprocess
    import sys
    import threading

    import etc.models
    from etc.models.testing import tiny_config, write_checkpoint

    path = write_checkpoint(tmp_path / "tiny-chat", tiny_config(vocab_size=320), tokenizer=True)
    small = ["--max-model-len", "64", "--attention-chunk", "16"]
    whole = etc.models.load(path, workers=1, max_seq_len=64, attention_chunk=16)
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
        # Structured output: rank 0's grammar masks reach every rank's step.
        schema = {"type": "object", "properties": {"n": {"type": "integer"}},
                  "required": ["n"], "additionalProperties": False}
        answer = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
        constrained = chat("a number", response_format=answer)
        assert constrained.choices[0].message.content == whole.generate(
            [{"role": "user", "content": "a number"}], 6, ignore_eos=True,
            response_format=answer).text[0]
        assert constrained.choices[0].message.content.startswith('{"n"')
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


def test_speculative_decoding_on_two_ranks_gives_the_text_without_it(cli_checkpoint):
    """Prompt lookup with --tensor-parallel 2: the followers run the
    verification steps rank 0 plans (k + 1 rows per speculating request,
    their choices), and the greedy text is the one-rank model's without
    speculation."""
    path, cache, whole = cli_checkpoint
    prompt = "ab ab ab ab ab ab"
    result = _etc("generate", path, prompt, "--max-new-tokens", "16", "--tensor-parallel", "2",
                  "--speculative", "ngram", "--speculative-tokens", "3", "--cache-dir", cache,
                  *CLI_SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    want = whole.generate(prompt, 16).text[0]
    assert result.stdout == want + ("" if want.endswith("\n") else "\n"), result.stderr
    # And prompt lookup does propose on this text (so the ranks verified).
    assert sum(whole.generate(prompt, 16, speculative="ngram").proposed_tokens) > 0


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
