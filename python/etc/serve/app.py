"""The OpenAI-compatible HTTP server's app: FastAPI routes over an `Engine`
whose steps run in a thread of their own, so that the event loop never
waits for a kernel (`server` runs it with uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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

from ..models import reasoning as reasoning_
from ..models import tool_calls
from ..models.engine import Engine, RequestError, RequestOutput
from ..models.engine.constraints import Constraint, Grammar, GrammarError, harmony_final
from ..models.loading.tokenizer import ChatTemplateError
from .choice import AnswerForm, CollectedChoice, StreamedChoice
from .handoff import Handoff
from .logprobs import TokenText
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, _Sampling
from .replies import DONE, Envelope, error_event, sse, usage

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
    template's, `tool_calls.parser_for`) reads the model's tool calls; with
    harmony reasoning they are read with its channels ("harmony", set
    by itself; another parser is refused).
    `reasoning_parser` ("qwen3", "seed_oss", "harmony"; "auto": the model's,
    `reasoning.parser_for`; "none" or None: all content) splits a chat
    answer into `reasoning_content` and `content` (`etc.models.reasoning`)."""
    try:
        reasoning_parser = reasoning_.resolve(
            reasoning_parser, getattr(model.config, "architecture", None), model.tokenizer)
    except ValueError as error:
        raise ValueError(f"build_app: {error}") from None
    harmony = reasoning_parser == "harmony"
    if harmony and tool_call_parser is None:
        tool_call_parser = "harmony"  # harmony's calls are read with its channels
    if tool_call_parser not in (None, "harmony") and tool_call_parser not in tool_calls.PARSERS:
        raise ValueError(f"build_app: tool_call_parser={tool_call_parser!r} must be one of "
                         f"{tool_calls.PARSERS} or None")
    if tool_call_parser is None and model.tokenizer is not None:
        tool_call_parser = tool_calls.parser_for(model.tokenizer.chat_template)
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
        _check(model, name, body)
        tokenizer = _tokenizer(model, "messages")
        calling = bool(body.tools) and body.tool_choice != "none"
        if calling and tool_call_parser is None:
            raise APIError(400, "tools: this model's chat template writes no tool calls ETC "
                                "can read (give etc serve --tool-call-parser)", "tools")
        text = _render(tokenizer, body)
        prompt = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
        return await _complete(request, body, prompt, body.new_tokens, chat=True,
                               parser=tool_call_parser if calling else None,
                               reasoning=reasoning_parser, prompt_text=text)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check(model, name, body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: {len(prompt)} prompts in one request; one is "
                                    f"supported", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt: empty", "prompt")
            prompt = _tokenizer(model, "prompt").encode(
                prompt, add_special_tokens=body.add_special_tokens)
        return await _complete(request, body, list(prompt), body.new_tokens, chat=False)

    # -- the request path ----------------------------------------------------

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
        constraints = await _constraints(model, body, parser, chat and reasoning == "harmony")
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
        envelope = Envelope(request_id, chat, int(time.time()), name)
        form = AnswerForm(chat, parser=parser, reasoning=reasoning, prompt_text=prompt_text,
                          parallel_tool_calls=getattr(body, "parallel_tool_calls", None),
                          logprobs=body.top_logprob_count is not None, request_id=request_id)
        # Each choice's last output (its usage).
        lasts: list = [None] * len(handles)
        results = _results(outputs, handles, lasts)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            choices = [StreamedChoice(index, form, token_text) for index in range(len(handles))]
            return StreamingResponse(
                _events(results, choices, envelope, include_usage,
                        lambda: usage(len(prompt), lasts)),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        collected = [CollectedChoice(index, form, token_text) for index in range(len(handles))]
        # Wait for the result or for the client to leave, whichever comes
        # first (a closed connection cancels the request).
        collecting = asyncio.ensure_future(_collect(results, collected))
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
        error = collecting.result()
        if error is not None:
            raise error
        return envelope.whole([choice.choice() for choice in collected],
                              usage(len(prompt), lasts))

    return app


def _check(model, name: str, body: _Sampling) -> None:
    """Refuses a request for another model, a field the server does not
    honour, and token ids outside the vocabulary (400 naming the field)."""
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


async def _constraints(model, body: _Sampling, parser: Optional[str], harmony: bool) -> list:
    """A grammar matcher per choice (structured output, or the call
    `tool_choice` forces), or Nones; compiled in a thread: a large
    schema takes a while. `harmony`: a chat answer in harmony's
    channels, whose final message the structured output constrains."""
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
        if parser == "harmony":
            missing = [t for t in tool_calls.HARMONY_TOKENS
                       if model.tokenizer.token_to_id(t) is None]
            if missing:
                raise APIError(400, f"tool_choice: a forced harmony call needs the "
                                    f"special tokens {', '.join(missing)}, which this "
                                    f"model's tokenizer lacks", "tool_choice")
        tools = [t.model_dump() for t in body.tools]
        found = ("lark", tool_calls.forced_grammar(parser, tools, name), "tool_choice")
    elif found is not None and harmony:
        found = _harmony_final(model, found, parser)
    if found is None:
        return [None] * body.n
    kind, value, field = found
    grammar = Grammar(kind, value)
    try:
        return [await asyncio.to_thread(Constraint, model, grammar, field)
                for _ in range(body.n)]
    except GrammarError as error:
        raise APIError(400, str(error), error.param) from None


def _harmony_final(model, found: tuple, parser: Optional[str]) -> tuple:
    """(kind, value, field) of a harmony answer whose final message
    follows the structured output `found` (`constraints.harmony_final`)."""
    kind, value, field = found
    if parser is not None:
        # The model may call a tool (a commentary message) or answer:
        # the grammar would have to hold for one channel and not the other.
        raise APIError(400, f"{field}: with harmony, structured output and tools the "
                            f"model may call (tool_choice auto) are not supported "
                            f"together; give tool_choice \"none\" or no tools", field)
    try:
        grammar = harmony_final(Grammar(kind, value), model.tokenizer, field)
    except GrammarError as error:
        raise APIError(400, str(error), error.param) from None
    return grammar.kind, grammar.value, field


def _tokenizer(model, param: str):
    """The model's tokenizer; 400 naming `param` (the field that needs it)
    without one."""
    if model.tokenizer is None:
        raise APIError(400, f"{param}: this model has no tokenizer (tokenizer.json); "
                            f"give the prompt as token ids to /v1/completions", param)
    return model.tokenizer


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
    except TypeError as error:
        # A value the template cannot take as given: a variable, or a
        # message's (DeepSeek's joins a call's arguments as a string,
        # where transformers' convention, and ours, is a dict).
        param = "chat_template_kwargs" if body.chat_template_kwargs else "messages"
        raise APIError(400, f"{param}: the chat template cannot take the messages or "
                            f"chat_template_kwargs as given: {error}", param) from None
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


async def _results(outputs: asyncio.Queue, handles: list,
                   lasts: list) -> AsyncIterator[tuple]:
    """(choice index, output) of a request's choices as the engine makes
    them, each choice's last output kept in `lasts`, until every choice
    has finished; a client gone mid-request (the iterator closed) cancels
    the choices still running, so that their slots go to the next ones."""
    try:
        while any(last is None or not last.finished for last in lasts):
            index, output = await outputs.get()
            lasts[index] = output
            yield index, output
    finally:
        for handle in handles:
            if not handle.finished:
                handle.cancel()


def _error_of(output: RequestOutput) -> Optional[APIError]:
    """The error an output ends its request with, or None."""
    if output.finish_reason == "error":
        return APIError(500, f"the step failed: {output.error}", None, kind="internal_error")
    if output.finish_reason == "abort" and output.error:  # the server stops
        return APIError(503, output.error, None, kind="service_unavailable")
    return None


async def _events(results: AsyncIterator[tuple], choices: list, envelope: Envelope,
                  include_usage: bool, usage_now) -> AsyncIterator[str]:
    """A streamed answer's events: the chunks of each output of `results`
    (`StreamedChoice.chunk_choices`), an error event where one failed,
    the usage (`usage_now()`) where asked for, then [DONE]."""
    async for index, output in results:
        if (error := _error_of(output)) is not None:
            yield error_event(error.message, error.kind)
            break
        for choice in choices[index].chunk_choices(output):
            yield sse(envelope.chunk(choice, include_usage))
    if include_usage:
        yield sse(envelope.usage_chunk(usage_now()))
    yield DONE


async def _collect(results: AsyncIterator[tuple], choices: list) -> Optional[APIError]:
    """Gives each output of `results` to its `CollectedChoice`; returns the
    first error, or None."""
    async for index, output in results:
        if (error := _error_of(output)) is not None:
            return error
        choices[index].add(output)
    return None


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
