"""The OpenAI-compatible HTTP server's app: FastAPI routes over an `Engine`
whose steps run in a thread of their own, so that the event loop never
waits for a kernel (`server` runs it with uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
import weakref
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..models.engine import Engine, RequestError, RequestOutput
from ..models.engine.constraints import Constraint, Grammar, GrammarError
from ..models.loading.tokenizer import ChatTemplateError
from .handoff import Handoff
from .logprobs import TokenText, chat_logprobs, completion_logprobs
from . import reasoning as reasoning_
from . import tools as tools_
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, _Sampling

__all__ = ["build_app", "APIError", "SHUTTING_DOWN"]

logger = logging.getLogger("etc.serve")

#: The error of the requests a server's shutdown ends (`app.state.close`).
SHUTTING_DOWN = "the server is shutting down"
#: When the engine's thread has died (its error is in the server's log).
ENGINE_STOPPED = ("the engine has stopped (the server's log says why); restart the server "
                  "to serve requests again")

#: What the engine calls a parameter, as the API names it.
_API_PARAM = {"max_new_tokens": "max_tokens", "sampling": "temperature"}


class APIError(Exception):
    """An error answered as OpenAI answers one: `status`, and a body
    {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[str] = None, kind: str = "invalid_request_error"):
        # What a request brought back in a message is sent as UTF-8: a lone
        # surrogate in it would fail the answer itself.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = \
            status, message, param, code, kind

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content={"error": {
            "message": self.message, "type": self.kind, "param": self.param,
            "code": self.code}})


_UNION_MEMBERS = {"str", "int", "float", "bool", "none"}


def _param(location) -> Optional[str]:
    """A pydantic error location as a dotted field path: ("body", "messages",
    0, "role") -> "messages[0].role"."""
    path = ""
    for part in location:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif not isinstance(part, str) or part in _UNION_MEMBERS or "[" in part or "-" in part:
            continue  # pydantic's names of union members: str, list[int], ...
        else:
            path += f".{part}" if path else part
    return path or None


def build_app(model, *, served_model_name: Optional[str] = None, max_num_seqs: int = 8,
              max_model_len: Optional[int] = None, max_step_tokens: Optional[int] = None,
              speculative=None, engine: Optional[Engine] = None,
              tool_call_parser: Optional[str] = None,
              reasoning_parser: Optional[str] = "auto") -> FastAPI:
    """The server of `model` (an `etc.models.Model`) as a FastAPI app.

    `served_model_name` is the `model` clients name (default: the
    checkpoint directory's name); `max_num_seqs` requests run at once (while
    the KV cache has blocks for them; more wait in a queue), each of at most
    `max_model_len` tokens, prompt included (default: the model's
    `max_seq_len`); `max_step_tokens` bounds one step's tokens (default:
    the model's); `speculative` ("ngram" or an `etc.models.Speculative`)
    has requests verify proposed tokens in their steps. `engine` runs an
    existing `Engine` instead.

    Routes: GET /v1/models, POST /v1/chat/completions and /v1/completions
    (the OpenAI API and vLLM's extensions: every field takes effect or is
    refused by name, `etc.serve.protocol`; `usage.prompt_tokens_details.
    cached_tokens`: the prompt tokens a cached prefix held), GET /health,
    GET /metrics (Prometheus). The engine's
    thread starts and stops with the app's lifespan (uvicorn runs it).
    `app.state.close()` ends the requests in flight (streams end with an
    error event and `[DONE]`, others with 503) and refuses new ones (503):
    `etc.serve.server.Server` calls it when shutting down.
    `tool_call_parser` ("hermes", "llama3_json"; default: the chat
    template's, `tools.parser_for`) reads the model's tool calls.
    `reasoning_parser` ("qwen3", "harmony"; "auto": the model's,
    `reasoning.parser_for`; "none" or None: all content) splits a chat
    answer into `reasoning_content` and `content` (`etc.serve.reasoning`)."""
    if reasoning_parser not in reasoning_.CHOICES + (None,):
        raise ValueError(f"build_app: reasoning_parser={reasoning_parser!r} must be one of "
                         f"{reasoning_.CHOICES} or None")
    if reasoning_parser == "auto":
        reasoning_parser = reasoning_.parser_for(
            getattr(model.config, "architecture", None), model.tokenizer)
    elif reasoning_parser == "none":
        reasoning_parser = None
    harmony = reasoning_parser == "harmony"
    if harmony and tool_call_parser is None:
        tool_call_parser = "harmony"  # harmony's calls are read with its channels
    if tool_call_parser not in (None, "harmony") and tool_call_parser not in tools_.PARSERS:
        raise ValueError(f"build_app: tool_call_parser={tool_call_parser!r} must be one of "
                         f"{tools_.PARSERS} or None")
    if tool_call_parser is None and model.tokenizer is not None:
        tool_call_parser = tools_.parser_for(model.tokenizer.chat_template)
    if tool_call_parser == "harmony" and not harmony:
        raise ValueError("build_app: tool_call_parser='harmony' needs "
                         "reasoning_parser='harmony' (the calls are a harmony channel)")
    if harmony and tool_call_parser != "harmony":
        # Whole answers would read the text's calls, streams harmony's too.
        raise ValueError(f"build_app: tool_call_parser={tool_call_parser!r} with "
                         "reasoning_parser='harmony': harmony's calls are read with its "
                         "channels (leave tool_call_parser unset, or give "
                         "reasoning_parser='none')")
    harmony_stops = reasoning_.harmony_stop_ids(model.tokenizer) if harmony else []
    if engine is None:
        engine = Engine(model, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                        max_step_tokens=max_step_tokens, speculative=speculative)
    name = served_model_name or model.path.name
    metrics = ServerMetrics(engine, name)
    engine.on_finish = metrics.observe
    token_text = TokenText(model.tokenizer)
    created = int(time.time())
    # The engine's outputs go to the loop of their request, a step's at once.
    handoffs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Handoff]" = \
        weakref.WeakKeyDictionary()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.shutdown()

    app = FastAPI(title="ETC", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.model_name = name
    app.state.closing = False
    app.state.handoffs = handoffs

    def close() -> None:
        app.state.closing = True
        engine.abort(SHUTTING_DOWN)

    app.state.close = close

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        errors = error.errors()
        # A union (a prompt: text, ids, texts, ...) fails once per member:
        # the error that is not a type mismatch says what is wrong.
        first = next((e for e in errors if not e.get("type", "").endswith("_type")),
                     errors[0] if errors else {})
        if first.get("type") == "json_invalid":
            return APIError(400, f"the body is not valid JSON: {first.get('msg')}",
                            None).response()
        param = _param(first.get("loc", ()))
        message = first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":
            message = ("unknown field: ETC does not know it, and ignores nothing "
                       "(docs/models.md lists the fields it takes)")
        if param:
            message = f"{param}: {message}"
        return APIError(400, message, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return APIError(error.status_code, str(error.detail), None,
                        kind="not_found_error" if error.status_code == 404 else
                        "invalid_request_error").response()

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception):
        logger.exception("internal error")
        return APIError(500, f"internal error: {type(error).__name__}: {error}", None,
                        kind="internal_error").response()

    # -- routes --------------------------------------------------------------

    @app.get("/health")
    async def health():
        if app.state.closing:
            raise APIError(503, SHUTTING_DOWN, None, kind="service_unavailable")
        if not engine.running:
            raise APIError(503, ENGINE_STOPPED, None, kind="service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": created, "owned_by": "etc",
            "max_model_len": engine.max_model_len, "dtype": model.dtype}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check(body)
        tokenizer = _tokenizer("messages")
        calling = bool(body.tools) and body.tool_choice != "none"
        if calling and tool_call_parser is None:
            raise APIError(400, "tools: this model's chat template writes no tool calls ETC "
                                "can read (give etc serve --tool-call-parser)", "tools")
        text = _render(tokenizer, body)
        prompt = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
        if calling and harmony and body.tool_choice not in (None, "auto"):
            raise APIError(400, "tool_choice: only 'auto' (or 'none') with harmony's tool "
                                "calls", "tool_choice")
        return await _complete(request, body, prompt, body.new_tokens, chat=True,
                               parser=tool_call_parser if calling else None,
                               reasoning=reasoning_parser, prompt_text=text)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check(body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: {len(prompt)} prompts in one request; one is "
                                    f"supported", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt: empty", "prompt")
            prompt = _tokenizer("prompt").encode(prompt,
                                                 add_special_tokens=body.add_special_tokens)
        return await _complete(request, body, list(prompt), body.new_tokens, chat=False)

    # -- helpers -------------------------------------------------------------

    def _check(body: _Sampling) -> None:
        if body.model != name:
            raise APIError(404, f"the model '{body.model}' does not exist; this server "
                                f"serves '{name}'", "model", code="model_not_found",
                           kind="not_found_error")
        refused = body.refused()
        if refused is not None:
            raise APIError(400, refused[1], refused[0])
        if any(body.stop_strings()) and model.tokenizer is None:
            raise APIError(400, "stop strings need the model's tokenizer", "stop")
        vocab = model.config.vocab_size
        for key in body.logit_bias or {}:
            if not key.isdigit() or int(key) >= vocab:
                raise APIError(400, f"logit_bias: {key!r} is not a token id in [0, {vocab})",
                               "logit_bias")
        for i, token in enumerate(body.stop_token_ids or ()):
            if not 0 <= token < vocab:
                raise APIError(400, f"stop_token_ids[{i}]: {token} is not a token id in "
                                    f"[0, {vocab})", f"stop_token_ids[{i}]")

    async def _constraints(body: _Sampling, parser: Optional[str]) -> list:
        """A grammar matcher per choice (structured output, or the call
        `tool_choice` forces), or Nones; compiled in a thread: a large
        schema takes a while."""
        try:
            found = body.grammar()
        except ValueError as error:
            raise APIError(400, error.args[1], error.args[0]) from None
        choice = getattr(body, "tool_choice", None)
        if parser is not None and choice not in (None, "auto"):
            if found is not None:
                raise APIError(400, f"tool_choice: a forced tool call and {found[2]} both "
                                    f"constrain the answer; give one", "tool_choice")
            name = None if choice == "required" else choice.function.name
            tools = [t.model_dump() for t in body.tools]
            found = ("lark", tools_.forced_grammar(parser, tools, name), "tool_choice")
        if found is None:
            return [None] * body.n
        kind, value, field = found
        grammar = Grammar(kind, value)
        try:
            return [await asyncio.to_thread(Constraint, model, grammar, field)
                    for _ in range(body.n)]
        except GrammarError as error:
            raise APIError(400, str(error), error.param) from None

    def _tokenizer(param: str):
        if model.tokenizer is None:
            raise APIError(400, f"{param}: this model has no tokenizer (tokenizer.json); "
                                f"give the prompt as token ids to /v1/completions", param)
        return model.tokenizer

    async def _complete(request: Request, body: _Sampling, prompt: list,
                        max_tokens: Optional[int], chat: bool, parser: Optional[str] = None,
                        reasoning: Optional[str] = None, prompt_text: str = ""):
        if app.state.closing:
            raise APIError(503, SHUTTING_DOWN, None, kind="service_unavailable")
        if not engine.running:  # its thread died: no step would ever come
            raise APIError(503, ENGINE_STOPPED, None, kind="service_unavailable")
        loop = asyncio.get_running_loop()
        handoff = handoffs.get(loop)
        if handoff is None:
            handoff = handoffs[loop] = Handoff(loop)
        # (choice index, output) of every choice, as the engine makes them.
        outputs: asyncio.Queue = asyncio.Queue()
        handles = []
        constraints = await _constraints(body, None if parser == "harmony" else parser)
        stop_token_ids, skip_special = body.stop_token_ids, body.skip_special_tokens
        if reasoning == "harmony":
            # Harmony's markers are special tokens: kept in the text until
            # read (the reader drops them); <|return|> and <|call|> end it.
            stop_token_ids = list(stop_token_ids or ()) + harmony_stops
            skip_special = False
        try:
            for index, sampling in enumerate(_choices(body)):
                handles.append(engine.submit(
                    prompt, max_new_tokens=max_tokens, stop=body.stop_strings(),
                    ignore_eos=body.ignore_eos, sampling=sampling,
                    stop_token_ids=stop_token_ids,
                    include_stop_str_in_output=body.include_stop_str_in_output,
                    skip_special_tokens=skip_special,
                    min_tokens=body.min_tokens or 0,
                    allowed_token_ids=body.allowed_token_ids, constraint=constraints[index],
                    on_output=lambda output, index=index: handoff.put(
                        outputs, (index, output))))
        except RequestError as error:
            for handle in handles:
                handle.cancel()
            param = _API_PARAM.get(error.param, error.param)
            if param == "prompt" and chat:
                param = "messages"
            if param == "max_tokens" and getattr(body, "max_completion_tokens", None):
                param = "max_completion_tokens"  # the field the client gave
            raise APIError(400, f"{param}: {error}", param) from None
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        for field in ("user", "safety_identifier"):
            if getattr(body, field, None) is not None:
                logger.info("%s: %s %r", request_id, field, getattr(body, field))
        kind = "chat.completion" if chat else "text_completion"
        stamp = int(time.time())
        # Each choice's last output (its usage) and the first error.
        lasts: list = [None] * len(handles)

        async def results() -> AsyncIterator[tuple]:
            try:
                while any(last is None or not last.finished for last in lasts):
                    index, output = await outputs.get()
                    lasts[index] = output
                    yield index, output
            finally:
                # A client gone mid-request: the slots go to the next ones.
                for handle in handles:
                    if not handle.finished:
                        handle.cancel()

        def usage() -> dict:
            completion_tokens = sum(o.num_tokens for o in lasts if o is not None)
            cached = lasts[0].cached_tokens if lasts[0] is not None else 0
            return {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                    "total_tokens": len(prompt) + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": cached}}

        def error_of(output: RequestOutput) -> Optional[APIError]:
            if output.finish_reason == "error":
                return APIError(500, f"the step failed: {output.error}", None,
                                kind="internal_error")
            if output.finish_reason == "abort" and output.error:  # the server stops
                return APIError(503, output.error, None, kind="service_unavailable")
            return None

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:
            async def events():
                first = [True] * len(handles)
                offsets = [0] * len(handles)
                readers = [tools_.CallStream(parser, body.parallel_tool_calls is not False)
                           for _ in handles] if parser not in (None, "harmony") else None
                thinking = [reasoning_.Reader(reasoning, prompt_text) for _ in handles] \
                    if reasoning is not None and chat else None
                sent_calls = [0] * len(handles)
                async for index, output in results():
                    if (error := error_of(output)) is not None:
                        yield _sse({"error": {"message": error.message, "type": error.kind}})
                        break
                    if chat:
                        reason = output.finish_reason
                        pieces = [("content", output.text)]
                        deltas = []
                        if thinking is not None:
                            # Reasoning first, then the answer; a marker
                            # split across chunks is held until read.
                            reader = thinking[index]
                            pieces = reader.feed(output.text) + (
                                reader.finish() if output.finished else [])
                            calls = reader.calls[sent_calls[index]:]
                            if calls and parser is None and output.finished:
                                _dropped(request_id, calls)
                            if body.parallel_tool_calls is False:
                                calls = calls[:1 - sent_calls[index]]
                            if parser is not None and calls:
                                deltas += [{"tool_calls": [{"index": sent_calls[index] + k,
                                                            **call}]}
                                           for k, call in enumerate(calls)]
                                sent_calls[index] += len(calls)
                            if sent_calls[index] and reason == "stop":
                                reason = "tool_calls"
                        for field, piece in pieces:
                            if field == "content" and readers is not None:
                                # Tool calls as OpenAI streams them: deltas of
                                # their own, the text held while it may be one.
                                deltas += readers[index].feed(piece)
                            else:
                                deltas.append({field: piece})
                        if readers is not None:
                            stream = readers[index]
                            if output.finished:
                                deltas += stream.finish()
                            if stream.calls and reason == "stop":
                                reason = "tool_calls"
                        # Empty while a reader holds the text back.
                        deltas = deltas or [{}]
                        if first[index]:
                            deltas[0]["role"] = "assistant"
                        lp = chat_logprobs(token_text, output.logprobs)
                        choices = [{"index": index, "delta": delta,
                                    "logprobs": lp if k == 0 else None,
                                    "finish_reason": reason if k == len(deltas) - 1 else None}
                                   for k, delta in enumerate(deltas)]
                        # Text held back (a call's start) sends nothing.
                        choices = [c for c in choices if c["delta"] or c["logprobs"] or
                                   c["finish_reason"]]
                    else:
                        choices = [{"index": index, "text": output.text,
                                    "logprobs": completion_logprobs(
                                        token_text, output.logprobs, offsets[index]),
                                    "finish_reason": output.finish_reason}]
                        offsets[index] += sum(len(token_text(t.token_id))
                                              for t in output.logprobs or ())
                    first[index] = False
                    for choice in choices:
                        chunk = {"id": request_id,
                                 "object": f"{kind}.chunk" if chat else kind,
                                 "created": stamp, "model": name, "choices": [choice]}
                        if include_usage:
                            chunk["usage"] = None
                        yield _sse(chunk)
                if include_usage:
                    yield _sse({"id": request_id, "object": f"{kind}.chunk" if chat else kind,
                                "created": stamp, "model": name, "choices": [],
                                "usage": usage()})
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        async def collect():
            texts = [[] for _ in handles]
            logprobs = [[] for _ in handles]
            async for index, output in results():
                if (error := error_of(output)) is not None:
                    return error, texts, logprobs
                texts[index].append(output.text)
                logprobs[index] += output.logprobs or ()
            return None, texts, logprobs

        # Wait for the result or for the client to leave, whichever comes
        # first (a closed connection cancels the request).
        collecting = asyncio.ensure_future(collect())
        disconnect = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collecting, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
        if not collecting.done():
            collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting
            return Response(status_code=499)
        error, texts, logprobs = collecting.result()
        if error is not None:
            raise error
        choices = []
        for index, last in enumerate(lasts):
            text = "".join(texts[index])
            lp = logprobs[index] if body.top_logprob_count is not None else None
            reason = last.finish_reason
            if chat:
                message = {"role": "assistant", "content": text}
                calls = []
                if reasoning is not None:
                    message["reasoning_content"], message["content"], calls = \
                        reasoning_.split(reasoning, text, prompt_text)
                    if calls and parser is None:
                        _dropped(request_id, calls)
                        calls = []
                    if body.parallel_tool_calls is False:
                        calls = calls[:1]
                if parser not in (None, "harmony"):
                    message["content"], calls = _calls(parser, message["content"] or "",
                                                       body)
                if calls:
                    message["tool_calls"] = calls
                    reason = "tool_calls" if reason == "stop" else reason
                choice = {"index": index, "message": message,
                          "logprobs": chat_logprobs(token_text, lp)}
            else:
                choice = {"index": index, "text": text,
                          "logprobs": completion_logprobs(token_text, lp)}
            choice["finish_reason"] = reason
            choices.append(choice)
        return {"id": request_id, "object": kind, "created": stamp, "model": name,
                "choices": choices, "usage": usage()}

    return app


#: Template variables a request sets through fields of their own.
_TEMPLATE_FIELDS = ("messages", "add_generation_prompt", "tools", "documents")


def _render(tokenizer, body: ChatCompletionRequest) -> str:
    """The prompt text of a chat request: its messages through the chat
    template, with `add_generation_prompt`, `documents` and
    `chat_template_kwargs`; with `continue_final_message`, cut just after
    the last message's content, so that the reply continues it."""
    extra = dict(body.chat_template_kwargs or {})
    for name in _TEMPLATE_FIELDS:
        if name in extra:
            raise APIError(400, f"chat_template_kwargs.{name}: set by the request's own "
                                f"fields, not here", f"chat_template_kwargs.{name}")
    if body.documents is not None:
        extra["documents"] = body.documents
    if body.tools and body.tool_choice != "none":
        extra["tools"] = [tool.for_template() for tool in body.tools]
    messages = [m.for_template() for m in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, **extra)
    except ChatTemplateError as error:
        raise APIError(400, str(error), "messages") from None
    except TypeError as error:  # a variable the template cannot take as given
        raise APIError(400, f"chat_template_kwargs: {error}", "chat_template_kwargs") from None
    if body.continue_final_message:
        last = messages[-1]["content"]
        end = text.rfind(last) if last else -1
        if end < 0:
            raise APIError(400, "continue_final_message: the last message's content is "
                                "empty, or the chat template does not render it as given",
                           "continue_final_message")
        text = text[:end + len(last)]
    return text


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the request's body has
    been read, so the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


#: Characters JSON leaves as they are that str.splitlines (and so httpx's
#: `iter_lines`) takes for line ends: escaped, an event stays one line.
_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False).translate(_LINE_ENDS)}\n\n"


def _dropped(request_id: str, calls: list) -> None:
    """Says that an answer's calls (harmony's) are dropped: the request
    gave no tools to call."""
    logger.warning("%s: the answer calls %s, but the request gave no tools: the calls are "
                   "dropped", request_id, ", ".join(c["function"]["name"] for c in calls))


def _calls(parser: str, text: str, body) -> tuple:
    """(content, calls) of an answer (`tools.parse`), at most one call with
    parallel_tool_calls false."""
    content, calls = tools_.parse(parser, text)
    if body.parallel_tool_calls is False:
        calls = calls[:1]
    return content, calls


def _choices(body: _Sampling) -> list:
    """The sampling parameters of each of the request's `n` choices: with a
    seed, choice i draws with seed + i, so that the choices differ and the
    request is reproducible."""
    try:
        sampling = _sampling(body)
    except ValueError as error:  # what the body's own checks let through
        message = str(error).removeprefix("SamplingParams: ")
        field = message.split("=")[0].split("[")[0].split(":")[0]
        raise APIError(400, message, field) from None
    if body.n == 1 or sampling is None or sampling.seed is None:
        return [sampling] * body.n
    return [dataclasses.replace(sampling, seed=(sampling.seed + i) % (1 << 64))
            for i in range(body.n)]


def _sampling(body: _Sampling):
    """The request's sampling parameters: None (greedy) at temperature 0
    without log-probabilities; otherwise an
    `etc.models.step.sampling.SamplingParams`. The API's default
    temperature is 1."""
    temperature = 1.0 if body.temperature is None else body.temperature
    logprobs = body.top_logprob_count
    from ..models.step.sampling import SamplingParams

    options = dict(temperature=temperature, seed=body.seed, logprobs=logprobs,
                   logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()})
    for field in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        if getattr(body, field) is not None:
            options[field] = getattr(body, field)
    params = SamplingParams(**options)
    if temperature == 0.0 and logprobs is None and not params.adjusts_logits:
        return None
    changes = {field: getattr(body, field) for field in ("top_p", "top_k", "min_p")
               if getattr(body, field) is not None}
    return dataclasses.replace(params, **changes) if changes else params
