"""Greedy generation with a Hugging Face checkpoint compiled by ETC.

    python examples/generate.py CHECKPOINT --prompt-ids 1 2 3 --prompt-ids 7 8
    python examples/generate.py CHECKPOINT --prompt "The capital of France is"
    python examples/generate.py /tmp/tiny --tiny qwen3 --prompt-ids 1 2 3

CHECKPOINT is a directory with config.json and *.safetensors (Llama, Qwen3
or Qwen3-MoE). Text prompts need its tokenizer.json. `--tiny ARCH` first
writes a small random checkpoint of that architecture (llama, qwen3,
qwen3_moe) with a trained BPE tokenizer to CHECKPOINT, which must be empty
or not exist yet, so the script runs without downloading anything. Prints
the new tokens and text of each prompt, why it stopped, and the tokens per
second (overall, and of the decode-only steps).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import etc.models

TINY = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint directory")
    parser.add_argument("--prompt-ids", type=int, nargs="+", action="append", default=[],
                        metavar="ID", help="a prompt as token ids (repeat for a batch)")
    parser.add_argument("--prompt", action="append", default=[],
                        help="a text prompt (needs tokenizer.json; repeat for a batch)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--ignore-eos", action="store_true",
                        help="generate max-new-tokens even past an end-of-sequence id")
    parser.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--chip", default="sm_90a")
    parser.add_argument("--schedule", default="auto", choices=("auto", "static", "dynamic"))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--dtype", default="auto", choices=("auto", "f32", "f16", "bf16"),
                        help="compute dtype (default: auto, the checkpoint's own)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="longest prompt + new tokens (default: the config's maximum)")
    parser.add_argument("--tiny", choices=sorted(TINY),
                        help="first write a small random checkpoint of this architecture")
    args = parser.parse_args(argv)

    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens {args.max_new_tokens} must be at least 1")
    if args.tiny:
        from etc.models.testing import tiny_config, write_checkpoint

        # Never over a checkpoint: config.json and model.safetensors would
        # be replaced by random ones.
        if args.checkpoint.exists() and (not args.checkpoint.is_dir() or
                                         any(args.checkpoint.iterdir())):
            parser.error(f"--tiny writes a random checkpoint into {args.checkpoint}, which "
                         f"is not an empty directory; give a new or empty one")
        write_checkpoint(args.checkpoint, tiny_config(TINY[args.tiny], hidden_size=256,
                                                      intermediate_size=512,
                                                      num_attention_heads=8,
                                                      num_key_value_heads=4, head_dim=32,
                                                      num_hidden_layers=4, vocab_size=1024,
                                                      max_position_embeddings=1024),
                         tokenizer=True)
        print(f"wrote a random {TINY[args.tiny]} checkpoint to {args.checkpoint}")

    # The config and tensor headers first (cheap): the user's mistakes are
    # reported before minutes of compiling, and as messages, not tracebacks.
    try:
        config = etc.models.Checkpoint(args.checkpoint).config
    except (OSError, ValueError) as error:
        parser.error(str(error))
    if args.prompt and not (args.checkpoint / "tokenizer.json").is_file():
        parser.error(f"--prompt needs {args.checkpoint / 'tokenizer.json'}; give --prompt-ids "
                     f"instead")
    id_prompts = [list(p) for p in args.prompt_ids]
    prompts = id_prompts + list(args.prompt)
    if not prompts:
        parser.error("give at least one --prompt-ids or --prompt")
    longest = args.max_seq_len or config.max_position_embeddings
    for p, prompt in enumerate(id_prompts):
        bad = [token for token in prompt if not 0 <= token < config.vocab_size]
        if bad:
            parser.error(f"prompt {p}: token id {bad[0]} is outside the vocabulary "
                         f"[0, {config.vocab_size}) of {args.checkpoint}")
        if len(prompt) + args.max_new_tokens > longest:
            parser.error(f"prompt {p} has {len(prompt)} tokens: with --max-new-tokens "
                         f"{args.max_new_tokens} the sequence is longer than the "
                         f"{longest} positions the model is compiled for (--max-seq-len)")

    start = time.perf_counter()
    try:
        model = etc.models.load(args.checkpoint, target=args.target, schedule=args.schedule,
                                workers=args.workers, dtype=args.dtype,
                                max_seq_len=args.max_seq_len, chip=args.chip)
        print(f"{model}: compiled in {time.perf_counter() - start:.2f} s "
              f"({len(model.kernels)} kernel)")
        out = model.generate(prompts, args.max_new_tokens, ignore_eos=args.ignore_eos)
    except (ValueError, RuntimeError) as error:
        # Bad options (a dtype, a length), a text prompt too long, and a
        # missing GPU: a message.
        print(f"{parser.prog}: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    for p, prompt in enumerate(prompts):
        print(f"prompt {prompt!r} -> {out.tokens[p]} ({out.finish_reasons[p]})")
        if out.text is not None:
            print(f"  {out.text[p]!r}")
    new = sum(len(t) for t in out.tokens)
    print(f"{new} new tokens in {out.steps} steps, {out.seconds:.3f} s: "
          f"{out.tokens_per_second:.1f} tokens/s; decode-only steps: "
          f"{out.decode_tokens_per_second:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
