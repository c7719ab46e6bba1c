"""`etc generate` and `etc chat`: text streamed as the engine makes it, one
prompt or an interactive conversation through the chat template; a chat
answer's reasoning (`--reasoning-parser`, `etc.models.reasoning`) apart
from its content, on stderr."""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from ..models import reasoning
from .model import engine_class, load_model, tokenizer_of
from .options import sampling_params, speculative
from .output import one_line
from .ranks import INTERACTIVE_VARIABLE, led


def stream(engine, ids: list, args, out, reader: Optional[reasoning.Reader] = None) -> str:
    """Runs one request on `engine` and writes its text to `out` as it
    comes; returns the text. With `reader` (a chat answer's), only the
    content goes to `out` and is returned, the reasoning to stderr, as the
    server tells them apart (a harmony answer keeps its markers until read
    and ends at `<|return|>` or `<|call|>`). With --verbose, says on
    stderr when the first token came and how fast the rest did."""
    budget = engine.max_model_len - len(ids)
    if budget < 1:
        limit = (f"the KV cache holds ({engine.max_model_len} positions; see --kv-cache-tokens "
                 f"and --kv-cache-memory)" if engine.limited_by_cache else
                 f"--max-model-len={engine.max_model_len} allows")
        raise ValueError(f"the prompt has {len(ids)} tokens, as many as {limit}: nothing is "
                         f"left to generate")
    harmony = reader is not None and reader.parser == "harmony"
    handle = engine.submit(
        ids, max_new_tokens=min(args.max_new_tokens, budget), stop=args.stop,
        sampling=args.sampling, skip_special_tokens=not harmony,
        stop_token_ids=reasoning.harmony_stop_ids(engine.model.tokenizer) if harmony else None)
    pieces = []
    thinking = False
    start = time.perf_counter()
    first = None
    count = 0
    for output in handle.outputs():
        if output.error:
            raise RuntimeError(f"generation failed: {output.error}")
        if output.token_ids and first is None:
            first = time.perf_counter() - start
        count += len(output.token_ids)
        read = [(reasoning.CONTENT, output.text)] if reader is None else \
            reader.feed(output.text) + (reader.finish() if output.finished else [])
        for field, text in read:
            if field == reasoning.REASONING:
                thinking = True
                sys.stderr.write(text)
                sys.stderr.flush()
                continue
            if thinking:  # the answer on a line of its own
                thinking = False
                sys.stderr.write("\n")
                sys.stderr.flush()
            if text:
                pieces.append(text)
                out.write(text)
                out.flush()
    if getattr(args, "verbose", False) and first is not None:
        rest = time.perf_counter() - start - first
        rate = f", then {(count - 1) / rest:.1f} tokens/s" if count > 1 and rest > 0 else ""
        print(f"\netc: {len(ids)} prompt tokens, first new token after {first:.3f} s, "
              f"{count} new tokens{rate}", file=sys.stderr)
    return "".join(pieces)


def run_generate(args) -> int:
    args.sampling = sampling_params(args)  # checked before the model loads
    if not args.chat and args.reasoning_parser in reasoning.PARSERS:
        # A text prompt's answer is all text (as /v1/completions reads it).
        raise ValueError(f"--reasoning-parser {args.reasoning_parser} reads a chat's answer: "
                         f"give --chat too")
    Engine = engine_class()
    model = load_model(args)
    return led(model, args, lambda model: generate_text(Engine, model, args))


def chat_reader(model, args, prompt: str) -> Optional[reasoning.Reader]:
    """A reader of the answer to chat `prompt` (its rendered text) in the
    model's reasoning format (--reasoning-parser), or None."""
    parser = reasoning.resolve(getattr(args, "reasoning_parser", "auto"),
                               getattr(model.config, "architecture", None), model.tokenizer)
    return reasoning.Reader(parser, prompt) if parser is not None else None


def generate_text(Engine, model, args) -> int:
    tokenizer = tokenizer_of(model)
    reader = None
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                             add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        reader = chat_reader(model, args, text)
    else:
        ids = tokenizer.encode(args.prompt)
    engine = Engine(model, max_num_seqs=1, speculative=speculative(args))
    text = stream(engine, ids, args, sys.stdout, reader)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


def run_chat(args) -> int:
    args.sampling = sampling_params(args)  # checked before the model loads
    Engine = engine_class()
    model = load_model(args)
    return led(model, args, lambda model: chat_loop(Engine, model, args))


def chat_loop(Engine, model, args) -> int:
    tokenizer = tokenizer_of(model)
    if tokenizer.chat_template is None:
        raise ValueError(f"{model.path} has no chat template (chat_template.jinja, "
                         f"tokenizer_config.json's chat_template, or tokenizer.chat_template "
                         f"in a GGUF file); use 'etc generate' for plain text")
    engine = Engine(model, max_num_seqs=1, speculative=speculative(args))
    interactive = sys.stdin.isatty() or os.environ.get(INTERACTIVE_VARIABLE) == "1"
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    if interactive:
        print("Type a message; /reset starts over, /exit (or Ctrl-D) leaves.", file=sys.stderr)
    while True:
        if interactive:
            try:
                line = input("> ")
            except EOFError:
                print(file=sys.stderr)
                break
        else:
            line = sys.stdin.readline()
            if not line:
                break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        try:
            # The conversation keeps the content (as a client of the
            # server's sends it back), not the reasoning.
            reply = stream(engine, ids, args, sys.stdout, chat_reader(model, args, text))
        except ValueError as error:
            # The conversation outgrew the model length: say so, forget the
            # message, and go on.
            messages.pop()
            print(f"etc: {one_line(error)} (/reset starts over)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": reply})
    return 0
