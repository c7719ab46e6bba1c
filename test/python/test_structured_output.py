"""Structured output (issue 35): JSON schemas, JSON objects, regular
expressions, choices and Lark grammars compiled with llguidance into a
token bitmask per request and step, applied on the device. Through the
real `openai` client over HTTP on localhost, and 200 random JSON schemas
sampled at temperature 0.8 through the engine, every output parsed and
validated (a checker of the schema subset the generator uses, below)."""

import json
import random
import re

import httpx
import pytest

import etc.models
from etc.models.engine import Engine
from etc.models.engine.constraints import Constraint, Grammar, GrammarError
from etc.models.step.sampling import SamplingParams
from etc.models.testing import tiny_config, write_checkpoint
from test_serve import Server

NAME = "tiny-json"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
USER = [{"role": "user", "content": "Who?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tests' tiny Qwen3 with room for JSON: 256 positions."""
    path = write_checkpoint(tmp_path_factory.mktemp("json") / "tiny-json",
                            tiny_config(vocab_size=320), tokenizer=True)
    return etc.models.load(path, workers=2, max_seq_len=256, attention_chunk=32)


@pytest.fixture(scope="module")
def server(model):
    with Server.of(model, NAME, max_num_seqs=8) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


# -- a checker of the JSON schemas used here ------------------------------------


def validate(value, schema: dict, path: str = "$") -> None:
    """Raises AssertionError where `value` breaks `schema` (types, enum,
    ranges, lengths, properties, required, additionalProperties, items)."""
    kind = schema.get("type")
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    checks = {"object": dict, "array": list, "string": str, "boolean": bool,
              "null": type(None)}
    if kind in checks:
        assert isinstance(value, checks[kind]), f"{path}: {value!r} is not {kind}"
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r}"
    if kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), path
    if kind in ("integer", "number"):
        assert schema.get("minimum", -float("inf")) <= value <= \
            schema.get("maximum", float("inf")), f"{path}: {value} out of range"
    if kind == "string":
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1 << 30), \
            f"{path}: length {len(value)}"
    if kind == "array":
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 30), \
            f"{path}: {len(value)} items"
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{path}[{i}]")
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            assert name in value, f"{path}: {name} missing"
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(properties), f"{path}: extra {set(value) - set(properties)}"
        for name, item in value.items():
            if name in properties:
                validate(item, properties[name], f"{path}.{name}")


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """Nested objects, arrays with bounds, enums, numbers with ranges,
    optional fields; strings and arrays bounded, so that an answer ends."""
    kinds = ["string", "integer", "number", "boolean", "enum"] + \
        (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 200)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": rng.choice([10, 1000])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, None, True], rng.randint(1, 4))}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": low,
                "maxItems": low + rng.randint(0, 2)}
    names = rng.sample(["a", "b", "id", "name", "tags", "x", "value"], rng.randint(1, 3))
    properties = {name: random_schema(rng, depth + 1) for name in names}
    return {"type": "object", "properties": properties,
            "required": [n for n in names if rng.random() < 0.6],
            "additionalProperties": False}


# -- through the openai client --------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema(client, stream):
    options = dict(model=NAME, messages=USER, temperature=0.8, seed=3, max_tokens=200,
                   response_format={"type": "json_schema", "json_schema": {
                       "name": "person", "schema": PERSON, "strict": True}})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **options))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = chunks[-1].choices[0].finish_reason
    else:
        reply = client.chat.completions.create(**options)
        text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
    validate(json.loads(text), PERSON)
    assert reason == "stop"


def test_json_object_regex_choice_and_grammar(client):
    reply = client.chat.completions.create(model=NAME, messages=USER, temperature=1.0, seed=1,
                                           max_tokens=200,
                                           response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    for extra, check in (
            ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
            ({"guided_choice": ["yes", "no", "maybe"]}, lambda t: t in ("yes", "no", "maybe")),
            ({"structured_outputs": {"regex": "(ab)+c"}}, lambda t: re.fullmatch("(ab)+c", t)),
            ({"guided_grammar": 'start: "x" NUMBER\n%import common.NUMBER'},
             lambda t: re.fullmatch(r"x[0-9.eE+-]+", t))):
        for temperature in (0.0, 1.0):
            text = client.completions.create(model=NAME, prompt="Say:", max_tokens=60,
                                             temperature=temperature, seed=2,
                                             extra_body=extra).choices[0].text
            assert check(text), (extra, temperature, text)


def test_a_streamed_event_is_one_line_whatever_the_text(server):
    """Text with the characters str.splitlines takes for line ends
    (U+0085, U+2028, U+2029; JSON leaves them as they are) streams as
    events of one line each: httpx's iter_lines reads every one."""
    text = "a\x85b\u2028c\u2029d"
    body = {"model": NAME, "prompt": "Say:", "max_tokens": 40, "stream": True,
            "guided_choice": [text]}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    assert "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1]) == text


def test_n_choices_each_follow_the_schema(client):
    reply = client.chat.completions.create(
        model=NAME, messages=USER, temperature=1.0, seed=5, max_tokens=200, n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    texts = [c.message.content for c in reply.choices]
    for text in texts:
        validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"guided_regex": "[0-9"}, "guided_regex"),
    ({"guided_grammar": "start: ("}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"structured_outputs": {"yaml": "a"}}, "structured_outputs.yaml"),
]


@pytest.mark.parametrize("fields, param", BAD, ids=[b[1] for b in BAD])
def test_a_grammar_that_does_not_compile_is_a_400_naming_it(server, fields, param):
    response = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": NAME, "prompt": "x", "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param.split(".")[0] in error["message"], error


# -- the engine and Python --------------------------------------------------------


def test_200_random_schemas_all_parse_and_validate(model):
    """The goal: 200 random schemas (nested objects, bounded arrays, enums,
    ranged numbers, optional fields) sampled at temperature 0.8: every
    answer parses and validates."""
    rng = random.Random(35)
    schemas = [random_schema(rng) for _ in range(200)]
    engine = Engine(model, max_num_seqs=16)
    handles = [engine.submit([5, 6, 7], max_new_tokens=240,
                             sampling=SamplingParams(temperature=0.8, seed=i),
                             constraint=Constraint(model, Grammar("json_schema", schema)))
               for i, schema in enumerate(schemas)]
    engine.run()
    for schema, handle in zip(schemas, handles):
        result = handle.result()
        assert result.finish_reason == "stop", (schema, result.text)
        validate(json.loads(result.text), schema)
    assert len({h.result().text for h in handles}) > 100  # sampled, not one answer


@pytest.mark.parametrize("parallel", [False, True], ids=["one_by_one", "executor"])
def test_a_steps_masks_filled_together_are_each_constraints_own(model, monkeypatch, parallel):
    """`fill_masks` (one mask after another on two cores, llguidance's
    executor on more) gives each constraint the mask it gives alone, at
    every token of different answers."""
    from etc.models.engine import constraints

    monkeypatch.setattr(constraints, "_PARALLEL", parallel)
    answers = ['{"name":"Al","age":7}', '{"name":"Bea Ru","age":120}', '{"name":"","age":0}']
    tokens = [model.tokenizer.encode(a, add_special_tokens=False) for a in answers]
    together = [Constraint(model, Grammar("json_schema", PERSON)) for _ in answers]
    alone = [Constraint(model, Grammar("json_schema", PERSON)) for _ in answers]
    for step in range(min(map(len, tokens))):
        masks = constraints.fill_masks(together)
        for i, (constraint, ids) in enumerate(zip(alone, tokens)):
            assert (masks[i] == constraint.mask()).all(), (i, step)
            assert masks[i][ids[step] // 32] >> (ids[step] % 32) & 1
            constraint.accept(ids[step])
            together[i].accept(ids[step])


def test_generate_takes_a_response_format(model):
    out = model.generate("Once", 200, sampling=SamplingParams(temperature=0.8, seed=9),
                         response_format={"type": "json_schema",
                                          "json_schema": {"name": "p", "schema": PERSON}})
    validate(json.loads(out.text[0]), PERSON)
    assert out.finish_reasons == ["stop"]
    regex = model.generate(["a", "b"], 20, response_format=Grammar("regex", "[xy]{4}"))
    assert all(re.fullmatch("[xy]{4}", t) for t in regex.text)
    with pytest.raises(GrammarError, match="response_format"):
        model.generate("a", 4, response_format=Grammar("regex", "(("))
    with pytest.raises(ValueError, match="response_format"):
        model.generate("a", 4, response_format={"type": "yaml"})
