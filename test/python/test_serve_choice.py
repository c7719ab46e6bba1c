"""The server's answer, piece by piece, without a model or HTTP: a
choice's engine outputs read into chat deltas and messages
(`etc.serve.choice`: reasoning, tool calls of each format, harmony's,
parallel_tool_calls, log-probabilities, the role and the finish reason)
and the objects that carry them (`etc.serve.replies`). A streamed choice
and a collected one read the same outputs into the same answer, however
the text is cut."""

import json
import logging

import pytest

from etc.models.engine.requests import RequestOutput, TokenLogprobs
from etc.serve.choice import AnswerForm, CollectedChoice, StreamedChoice
from etc.serve.logprobs import TokenText
from etc.serve.replies import DONE, Envelope, error_event, sse, usage

TEXT = TokenText(None)  # a token's text: "token_id:N"

HERMES = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
HARMONY_CALLS = ("<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant"
                 "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}"
                 "<|call|><|start|>assistant<|channel|>commentary to=functions.g "
                 "<|constrain|>json<|message|>{}<|call|>")


def outputs(text: str, size: int, reason: str = "stop", logprobs: bool = False) -> list:
    """The engine's outputs of an answer `text`, `size` characters each,
    one token per output (id: its position)."""
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    return [RequestOutput(0, [k], piece, reason if k == len(pieces) - 1 else None,
                          num_tokens=k + 1,
                          logprobs=[TokenLogprobs(k, -0.5, ((k, -0.5),))] if logprobs else None)
            for k, piece in enumerate(pieces)]


def streamed(form: AnswerForm, answer: list) -> list:
    choice = StreamedChoice(0, form, TEXT)
    return [c for output in answer for c in choice.chunk_choices(output)]


def collected(form: AnswerForm, answer: list) -> dict:
    choice = CollectedChoice(0, form, TEXT)
    for output in answer:
        choice.add(output)
    return choice.choice()


def accumulated(chunks: list) -> dict:
    """A stream's chunks added up as a client adds them: the message, its
    calls by index, the finish reason."""
    message = {"content": "", "reasoning_content": ""}
    calls: dict = {}
    for chunk in chunks:
        delta = chunk["delta"]
        for field in ("content", "reasoning_content"):
            message[field] += delta.get(field) or ""
        for call in delta.get("tool_calls", ()):
            entry = calls.setdefault(call["index"], {"name": None, "arguments": ""})
            function = call.get("function", {})
            entry["name"] = function.get("name") or entry["name"]
            entry["arguments"] += function.get("arguments") or ""
    return {"content": message["content"] or None,
            "reasoning_content": message["reasoning_content"] or None,
            "calls": [(c["name"], c["arguments"]) for _, c in sorted(calls.items())],
            "finish_reason": chunks[-1]["finish_reason"]}


def whole(choice: dict) -> dict:
    message = choice["message"]
    return {"content": message["content"] or None,
            "reasoning_content": message.get("reasoning_content"),
            "calls": [(c["function"]["name"], c["function"]["arguments"])
                      for c in message.get("tool_calls", ())],
            "finish_reason": choice["finish_reason"]}


CASES = {
    "plain": (AnswerForm(True), "Hello there!",
              {"content": "Hello there!", "reasoning_content": None, "calls": [],
               "finish_reason": "stop"}),
    "hermes": (AnswerForm(True, parser="hermes"), HERMES,
               {"content": "Let me look.", "reasoning_content": None,
                "calls": [("f", '{"x": 1}')], "finish_reason": "tool_calls"}),
    "qwen3": (AnswerForm(True, reasoning="qwen3"), "<think>Hm.</think>\n\nYes.",
              {"content": "Yes.", "reasoning_content": "Hm.", "calls": [],
               "finish_reason": "stop"}),
    "harmony": (AnswerForm(True, parser="harmony", reasoning="harmony"), HARMONY_CALLS,
                {"content": None, "reasoning_content": "Two calls.",
                 "calls": [("f", '{"a":1}'), ("g", "{}")], "finish_reason": "tool_calls"}),
    "harmony, one call": (AnswerForm(True, parser="harmony", reasoning="harmony",
                                     parallel_tool_calls=False), HARMONY_CALLS,
                          {"content": None, "reasoning_content": "Two calls.",
                           "calls": [("f", '{"a":1}')], "finish_reason": "tool_calls"}),
}


@pytest.mark.parametrize("case", CASES)
def test_streamed_and_collected_agree_at_every_cut(case):
    form, text, expected = CASES[case]
    assert whole(collected(form, outputs(text, len(text)))) == expected
    for size in (1, 2, 5, len(text)):
        chunks = streamed(form, outputs(text, size))
        assert accumulated(chunks) == expected, size
        assert chunks[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in chunks[1:])
        assert [c["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
        # Every chunk says something: held-back text sends none.
        assert all(c["delta"] or c["finish_reason"] for c in chunks)


def test_a_streamed_call_comes_with_its_name_then_its_arguments():
    chunks = streamed(AnswerForm(True, parser="hermes"), outputs(HERMES, 3))
    calls = [call for c in chunks for call in c["delta"].get("tool_calls", ())]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "f", "arguments": ""}
    assert all("id" not in call for call in calls[1:]) and len(calls) > 2


def test_harmony_calls_without_tools_are_dropped_and_logged_once(caplog):
    form = AnswerForm(True, reasoning="harmony", request_id="chatcmpl-x")
    with caplog.at_level(logging.WARNING, logger="etc.serve"):
        chunks = streamed(form, outputs(HARMONY_CALLS, 4))
    assert accumulated(chunks)["calls"] == [] and chunks[-1]["finish_reason"] == "stop"
    assert caplog.text.count("chatcmpl-x: the answer calls f, g, but the request gave no "
                             "tools") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="etc.serve"):
        assert whole(collected(form, outputs(HARMONY_CALLS, 4)))["calls"] == []
    assert caplog.text.count("the calls are dropped") == 1


def test_a_call_cut_by_max_tokens_keeps_its_finish_reason():
    form, text, _ = CASES["hermes"]
    cut = text[:-len("</tool_call>")]
    assert whole(collected(form, outputs(cut, 4, "length")))["finish_reason"] == "length"
    assert streamed(form, outputs(cut, 4, "length"))[-1]["finish_reason"] == "length"


def test_chat_log_probabilities_come_with_the_first_delta_of_their_output():
    chunks = streamed(AnswerForm(True, logprobs=True), outputs("abc", 1, logprobs=True))
    assert [c["logprobs"]["content"][0]["token"] for c in chunks] == \
        ["token_id:0", "token_id:1", "token_id:2"]
    choice = collected(AnswerForm(True, logprobs=True), outputs("abc", 1, logprobs=True))
    assert [e["token"] for e in choice["logprobs"]["content"]] == \
        ["token_id:0", "token_id:1", "token_id:2"]
    # Asked for none: none, whatever the engine gave.
    assert collected(AnswerForm(True), outputs("abc", 1, logprobs=True))["logprobs"] is None


def test_a_text_completion_counts_its_offsets_across_chunks():
    form = AnswerForm(False, logprobs=True)
    chunks = streamed(form, outputs("abc", 1, "length", logprobs=True))
    assert [c["text"] for c in chunks] == ["a", "b", "c"]
    assert [c["logprobs"]["text_offset"] for c in chunks] == [[0], [10], [20]]
    assert [c["finish_reason"] for c in chunks] == [None, None, "length"]
    choice = collected(form, outputs("abc", 1, "length", logprobs=True))
    assert choice["text"] == "abc" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["text_offset"] == [0, 10, 20]


def test_the_envelopes():
    chat = Envelope("chatcmpl-1", True, 7, "m")
    head = {"id": "chatcmpl-1", "created": 7, "model": "m"}
    assert chat.chunk({"index": 0}, False) == {**head, "object": "chat.completion.chunk",
                                              "choices": [{"index": 0}]}
    assert chat.chunk({}, True)["usage"] is None
    assert chat.usage_chunk({"total_tokens": 3}) == {
        **head, "object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 3}}
    assert chat.whole([{"index": 0}], {}) == {**head, "object": "chat.completion",
                                             "choices": [{"index": 0}], "usage": {}}
    text = Envelope("cmpl-1", False, 7, "m")
    assert text.chunk({}, False)["object"] == text.whole([], {})["object"] == "text_completion"


def test_usage_and_events():
    last = [RequestOutput(0, [], "", "stop", num_tokens=4, cached_tokens=16),
            RequestOutput(0, [], "", "stop", num_tokens=6, cached_tokens=0)]
    assert usage(20, last) == {"prompt_tokens": 20, "completion_tokens": 10,
                               "total_tokens": 30, "prompt_tokens_details": {"cached_tokens": 16}}
    assert usage(5, [None]) == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5,
                                "prompt_tokens_details": {"cached_tokens": 0}}
    # One event a line: the line ends str.splitlines knows are escaped.
    event = sse({"text": "a\x85b\u2028c\u2029d\ne"})
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert len(event.rstrip("\n").splitlines()) == 1
    assert json.loads(event[6:]) == {"text": "a\x85b\u2028c\u2029d\ne"}
    assert json.loads(error_event("gone", "service_unavailable")[6:]) == {
        "error": {"message": "gone", "type": "service_unavailable"}}
    assert DONE == "data: [DONE]\n\n"
