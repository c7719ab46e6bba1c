"""Structured output's grammar libraries side by side: llguidance (what ETC
uses) and XGrammar (vLLM's and SGLang's default), on the same tokenizer and
JSON schemas (issue 35's comparison).

For each schema: the time to compile it (XGrammar's compile of the
tokenizer's vocabulary, `TokenizerInfo` and `GrammarCompiler`, is done once
before and timed apart, as llguidance's `LLTokenizer`), then the time per
next-token mask along a valid answer (the answer's tokens accepted one by
one, a mask filled before each: what a decode step waits for). The answer
is `json.dumps` of an instance of the schema, tokenized by the tokenizer.
Medians over the schemas, and the schemas each library refused.

XGrammar 0.2.8 needs torch, transformers and triton, which ETC's
environment does not have: run this under a Python that has them and both
libraries (optional benchmark dependencies, e.g. the peer venv of
docs/benchmarks.md with `pip install xgrammar llguidance`), with a
tokenizer.json (e.g. written by `Tokenizer.backend.to_str()` from a GGUF
file):

  /path/to/peer/bin/python bench/grammar_libraries.py --tokenizer tokenizer.json \\
      --vocab 49152 --eos 2 [--schemas 40]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def random_schema(rng: random.Random, depth: int = 0) -> tuple[dict, object]:
    """A JSON schema (nested objects, bounded arrays, enums, numbers with
    ranges, optional fields) and an instance of it."""
    kinds = ["string", "integer", "number", "boolean", "enum"] + \
        (["object", "array"] if depth < 2 else [])
    kind = "object" if depth == 0 else rng.choice(kinds)  # an answer is an object
    if kind == "string":
        return {"type": "string", "maxLength": 12}, rng.choice(["red", "a b", "x" * 5])
    if kind == "integer":
        return {"type": "integer", "minimum": -5, "maximum": 500}, rng.randint(-5, 500)
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 10}, round(rng.uniform(0, 10), 2)
    if kind == "boolean":
        return {"type": "boolean"}, rng.random() < 0.5
    if kind == "enum":
        values = rng.sample(["north", "south", "east", "west", "up"], 3)
        return {"enum": values}, rng.choice(values)
    if kind == "array":
        item, value = random_schema(rng, depth + 1)
        count = rng.randint(1, 3)
        return ({"type": "array", "items": item, "minItems": 1, "maxItems": 3},
                [value] * count)
    properties, instance, required = {}, {}, []
    for i in range(rng.randint(1, 4)):
        name = f"field_{depth}_{i}"
        properties[name], value = random_schema(rng, depth + 1)
        if rng.random() < 0.7:
            required.append(name)
            instance[name] = value
    schema = {"type": "object", "properties": properties, "required": required,
              "additionalProperties": False}
    return schema, instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    parser.add_argument("--vocab", type=int, required=True, help="the model's vocabulary size")
    parser.add_argument("--eos", type=int, required=True, help="the end-of-sequence id")
    parser.add_argument("--schemas", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import llguidance
    import llguidance.numpy
    import numpy as np
    import xgrammar
    from transformers import PreTrainedTokenizerFast

    text = open(args.tokenizer).read()
    hf = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)
    rng = random.Random(args.seed)
    cases = [random_schema(rng) for _ in range(args.schemas)]

    start = time.perf_counter()
    ll_tokenizer = llguidance.LLTokenizer(text, n_vocab=args.vocab, eos_token=[args.eos])
    ll_setup = time.perf_counter() - start
    start = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=args.vocab,
                                                   stop_token_ids=[args.eos])
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    xg_setup = time.perf_counter() - start

    words = -(-args.vocab // 32)
    results = {"llguidance": ([], [], 0), "XGrammar": ([], [], 0)}
    for schema, instance in cases:
        source = json.dumps(schema)
        answer = hf.encode(json.dumps(instance), add_special_tokens=False)
        # llguidance
        compiles, masks, refused = results["llguidance"]
        start = time.perf_counter()
        matcher = llguidance.LLMatcher(ll_tokenizer,
                                       llguidance.LLMatcher.grammar_from_json_schema(source),
                                       log_level=0)
        compiles.append(time.perf_counter() - start)
        if matcher.is_error():
            results["llguidance"] = (compiles, masks, refused + 1)
        else:
            out = np.empty((1, words), np.int32)
            for token in answer:
                start = time.perf_counter()
                llguidance.numpy.fill_next_token_bitmask(matcher, out, 0)
                masks.append(time.perf_counter() - start)
                if not matcher.consume_token(token):
                    break
        # XGrammar
        compiles, masks, refused = results["XGrammar"]
        start = time.perf_counter()
        try:
            compiled = compiler.compile_json_schema(source, any_whitespace=False)
        except Exception:  # noqa: BLE001 - a schema it cannot compile counts as refused
            results["XGrammar"] = (compiles, masks, refused + 1)
            continue
        compiles.append(time.perf_counter() - start)
        matcher = xgrammar.GrammarMatcher(compiled)
        bitmask = xgrammar.allocate_token_bitmask(1, args.vocab)
        for token in answer:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            masks.append(time.perf_counter() - start)
            if not matcher.accept_token(token):
                break

    print(f"{len(cases)} schemas, vocabulary {args.vocab}; tokenizer setup: llguidance "
          f"{ll_setup * 1e3:.0f} ms, XGrammar {xg_setup * 1e3:.0f} ms\n")
    print("| library | compile ms (median, max) | mask us (median, p90) | masks | refused |")
    print("|---|---:|---:|---:|---:|")
    for name, (compiles, masks, refused) in results.items():
        masks_sorted = sorted(masks)
        p90 = masks_sorted[int(0.9 * (len(masks_sorted) - 1))] if masks else float("nan")
        print(f"| {name} | {statistics.median(compiles) * 1e3:.2f}, {max(compiles) * 1e3:.1f} "
              f"| {statistics.median(masks) * 1e6:.0f}, {p90 * 1e6:.0f} | {len(masks)} "
              f"| {refused} |")


if __name__ == "__main__":
    main()
