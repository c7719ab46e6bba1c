"""The serving soak (`bench/serve.py --soak`): many clients send a long mix of
requests to one server, and afterwards every answer is checked.

The mix, drawn from a seeded generator: chat and text completions (text
prompts, chats of up to three messages, token ids), prompts of 1 to ~300
tokens, max_tokens from 1 to 64 or none (up to the model length), greedy,
seeded and unseeded sampling (temperature, top_p, top_k, min_p), stop
strings, ignore_eos, streamed or not; some clients hang up mid-stream
(cancellations) or before a request that is not streamed ends
(disconnects), and a share of the requests is malformed (bad JSON, wrong
types and ranges, an unknown model, role or token id, prompts too long,
lone UTF-16 surrogates, unsupported fields). Requests arrive at random times
spread over `seconds` (0: as fast as the clients go), `clients` at most at
once.

Checked afterwards: every malformed request got the 4xx it should, naming
its field; every well-formed request that was not cancelled got 200, a
finish reason and a usage that add up; greedy and seeded ones the text,
token count and finish reason of the same request through `Model.generate`
offline; the server has no request running or waiting and no KV block
held; its memory grew by less than `max_rss_growth` (measured after a
warm-up tenth of the requests). `soak(...)` returns a `SoakReport`; its
`failures` list what did not hold.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

#: The bodies of malformed requests: (route, body or raw bytes, status, param).
MALFORMED = [
    ("chat/completions", b'{"model": "M", "messages": [', 400, None),
    ("chat/completions", {"model": "M"}, 400, "messages"),
    ("chat/completions", {"model": "M", "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role"),
    ("chat/completions", {"model": "M", "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ("chat/completions", {"model": "M", "messages": [{"role": "user", "content": "hi \ud83d"}]},
     400, "messages[0].content"),
    ("chat/completions", {"model": "M", "messages": [{"role": "user", "content": "x"}],
                          "max_tokens": 0}, 400, "max_tokens"),
    ("chat/completions", {"model": "M", "messages": [{"role": "user", "content": "x"}],
                          "temperature": 5}, 400, "temperature"),
    ("chat/completions", {"model": "M", "messages": [{"role": "user", "content": "x"}],
                          "n": 2}, 400, "n"),
    ("chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
     404, "model"),
    ("completions", {"model": "M", "prompt": [1, 2, 10 ** 6]}, 400, "prompt"),
    ("completions", {"model": "M", "prompt": "ok \udc00"}, 400, "prompt"),
    ("completions", {"model": "M", "prompt": "x", "stop": [1]}, 400, "stop"),
    ("completions", {"model": "M", "prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {"model": "M", "prompt": "LONG"}, 400, "prompt"),
    ("completions", {"model": "M", "prompt": [5, 6], "max_tokens": "LENGTH"}, 400,
     "max_tokens"),
]

#: Words the prompts are made of (those the test tokenizer was trained on).
WORDS = ("the quick brown fox jumps over lazy dog model reads text as tokens and writes "
         "back Hello world again how are you today I am fine thank Numbers 1 2 3 42 2048 "
         "Café crème naïve façade über 日本語 Привет мир 🙂 Résumé of day we serve models over "
         "HTTP").split()

#: Stop strings: short, so that some random continuations reach them.
STOPS = ("e", "the", ".", "o", "\n", "Hello", "🙂", "ab")


@dataclass
class Request:
    """One request of the soak and what came back."""

    index: int
    route: str
    body: object
    kind: str                      # "ok", "malformed", "cancel" or "disconnect"
    expect_status: int = 200
    expect_param: Optional[str] = None
    at: float = 0.0                # when it is sent, seconds after the start
    status: Optional[int] = None
    text: str = ""
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    error: Optional[dict] = None
    chunks: int = 0
    seconds: float = 0.0


@dataclass
class SoakReport:
    """What the soak did and found."""

    requests: list
    seconds: float
    max_rss_growth: float = 0.05
    checked_offline: int = 0
    rss_before: Optional[int] = None
    rss_after: Optional[int] = None
    final_state: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    def counts(self) -> dict:
        out = {}
        for request in self.requests:
            out[request.kind] = out.get(request.kind, 0) + 1
        return out

    def lines(self) -> list:
        """The report as text lines."""
        statuses = {}
        for r in self.requests:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        ok = sorted(r.seconds for r in self.requests if r.kind == "ok" and r.status == 200)
        streamed = sum(1 for r in self.requests
                       if isinstance(r.body, dict) and r.body.get("stream") and r.kind == "ok")
        sampled = sum(1 for r in self.requests if isinstance(r.body, dict) and
                      r.body.get("temperature") and r.kind == "ok")
        out = [f"{len(self.requests)} requests in {self.seconds:.0f} s: "
               + ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts().items()))
               + f"; {streamed} of the well-formed streamed, {sampled} sampled",
               "statuses: " + ", ".join(f"{k}: {v}" for k, v in
                                        sorted(statuses.items(), key=lambda kv: str(kv[0]))),
               f"checked against offline generate (greedy and seeded): {self.checked_offline}"]
        if ok:
            out.append(f"request seconds (answered, well-formed): median {ok[len(ok) // 2]:.2f}, "
                       f"p90 {ok[int(len(ok) * 0.9)]:.2f}, max {ok[-1]:.2f}")
        if self.rss_before:
            out.append(f"server RSS after the warm-up tenth {self.rss_before / 2**20:.1f} MiB, "
                       f"at the end {self.rss_after / 2**20:.1f} MiB "
                       f"({self.rss_growth:+.1%})")
        out.append("after: " + ", ".join(f"{k} {v}" for k, v in self.final_state.items()))
        out.append(f"failures: {len(self.failures)}")
        out += [f"  {failure}" for failure in self.failures[:20]]
        return out

    @property
    def rss_growth(self) -> Optional[float]:
        if not self.rss_before or self.rss_after is None:
            return None
        return self.rss_after / self.rss_before - 1


def make_requests(count: int, *, name: str, tokenizer, vocab: int, max_model_len: int,
                  seconds: float, malformed: float = 0.05, cancels: float = 0.03,
                  disconnects: float = 0.03, seed: int = 0) -> list:
    """`count` requests drawn from `seed` (see the module's docstring),
    with arrival times spread uniformly over `seconds`. The well-formed
    ones fit in `max_model_len` (measured with `tokenizer`)."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, seconds) for _ in range(count)) if seconds else \
        [0.0] * count
    out = []
    for i, at in enumerate(arrivals):
        draw = rng.random()
        if draw < malformed:
            route, body, status, param = rng.choice(MALFORMED)
            if isinstance(body, dict):
                body = json.loads(json.dumps(body).replace('"M"', json.dumps(name)))
                if body.get("prompt") == "LONG":
                    body["prompt"] = [5] * (max_model_len + 1)
                if body.get("max_tokens") == "LENGTH":
                    body["max_tokens"] = max_model_len
            out.append(Request(i, route, body, "malformed", status, param, at))
            continue
        kind = "cancel" if draw < malformed + cancels else \
            "disconnect" if draw < malformed + cancels + disconnects else "ok"
        route, body = _well_formed(rng, name, tokenizer, vocab, max_model_len)
        if kind == "cancel":
            body["stream"] = True
        elif kind == "disconnect":
            body["stream"] = False
        out.append(Request(i, route, body, kind, at=at))
    return out


def _well_formed(rng: random.Random, name: str, tokenizer, vocab: int, max_model_len: int):
    def words(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    lengths = [n for n in (1, 2, 4, 8, 16, 32, 64, 100, 150) if n <= max_model_len // 4]
    length = rng.choice(lengths)
    while True:
        if rng.random() < 0.5:
            route = "chat/completions"
            messages = [{"role": "user", "content": words(length)}]
            if rng.random() < 0.3:
                messages.insert(0, {"role": "system", "content": "You answer briefly."})
            if rng.random() < 0.2:
                messages[-1:-1] = [{"role": "user", "content": words(2)},
                                   {"role": "assistant", "content": words(2)}]
            body = {"model": name, "messages": messages}
            tokens = len(tokenizer.encode(tokenizer.apply_chat_template(messages),
                                          add_special_tokens=False))
        else:
            route = "completions"
            prompt = words(length) if rng.random() < 0.6 else \
                [rng.randrange(3, vocab) for _ in range(length)]
            body = {"model": name, "prompt": prompt}
            tokens = len(prompt) if isinstance(prompt, list) else len(tokenizer.encode(prompt))
        if tokens < max_model_len - 1:
            break
        length = max(1, length // 2)
    if rng.random() < 0.97:
        body["max_tokens"] = rng.randint(1, min(64, max_model_len - tokens))
    draw = rng.random()
    if draw < 0.5:
        body["temperature"] = 0.0
    else:
        body["temperature"] = round(rng.uniform(0.3, 1.5), 2)
        if draw < 0.75:
            body["seed"] = rng.randrange(2 ** 32)
        for field, value in (("top_p", round(rng.uniform(0.5, 1.0), 2)),
                             ("top_k", rng.randint(1, 50)),
                             ("min_p", round(rng.uniform(0, 0.2), 2))):
            if rng.random() < 0.4:
                body[field] = value
    if rng.random() < 0.25:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    if rng.random() < 0.5:
        body["ignore_eos"] = True
    body["stream"] = rng.random() < 0.5
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return route, body


async def _send(client, url: str, request: Request, rng: random.Random) -> None:
    import httpx

    start = time.perf_counter()
    target = f"{url}/v1/{request.route}"
    if isinstance(request.body, bytes):
        content = request.body
    else:
        content = json.dumps(request.body).encode()  # lone surrogates escaped, as JSON allows
    headers = {"content-type": "application/json"}
    try:
        if isinstance(request.body, dict) and request.body.get("stream"):
            await _stream(client, target, content, headers, request, rng)
        elif request.kind == "disconnect":
            try:
                await asyncio.wait_for(client.post(target, content=content, headers=headers),
                                       timeout=rng.uniform(0.02, 0.3))
            except asyncio.TimeoutError:
                pass  # hung up
        else:
            response = await client.post(target, content=content, headers=headers)
            request.status = response.status_code
            answer = response.json()
            if response.status_code == 200:
                choice = answer["choices"][0]
                # (A chat's null content is generate's "": docs/models.md, Reasoning.)
                request.text = (choice["message"]["content"] or "") if "message" in choice \
                    else choice["text"]
                request.finish_reason = choice["finish_reason"]
                request.usage = answer["usage"]
            else:
                request.error = answer.get("error")
    except (httpx.HTTPError, ValueError) as error:
        request.error = {"message": f"client: {type(error).__name__}: {error}"}
    request.seconds = time.perf_counter() - start


async def _stream(client, target, content, headers, request: Request, rng) -> None:
    hang_up_after = rng.randint(1, 4) if request.kind == "cancel" else None
    pieces = []
    async with client.stream("POST", target, content=content, headers=headers) as response:
        request.status = response.status_code
        if response.status_code != 200:
            request.error = json.loads(await response.aread()).get("error")
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                request.chunks += 1
                break
            chunk = json.loads(line[6:])
            request.chunks += 1
            if "error" in chunk:
                request.error = chunk["error"]
                continue
            if chunk.get("usage"):
                request.usage = chunk["usage"]
            for choice in chunk["choices"]:
                pieces.append(choice["delta"].get("content", "") if "delta" in choice else
                              choice["text"])
                request.finish_reason = choice["finish_reason"] or request.finish_reason
            if hang_up_after is not None and request.chunks >= hang_up_after:
                break  # closing the stream hangs up
    request.text = "".join(pieces)


async def _drive(url: str, requests: list, clients: int, on_warm: Callable) -> float:
    import httpx

    queue = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    warm_at = max(1, len(requests) // 10)
    done = [0]
    start = time.perf_counter()
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker(w):
            rng = random.Random(w)
            while not queue.empty():
                request = queue.get_nowait()
                wait = request.at - (time.perf_counter() - start)
                if wait > 0:
                    await asyncio.sleep(wait)
                await _send(client, url, request, rng)
                done[0] += 1
                if done[0] == warm_at:
                    on_warm()

        await asyncio.gather(*(worker(w) for w in range(clients)))
    return time.perf_counter() - start


def soak(url: str, model, requests: list, *, clients: int, max_model_len: int,
         state: Callable[[], dict], rss: Optional[Callable[[], int]] = None,
         max_rss_growth: float = 0.05, settle_seconds: float = 30.0) -> SoakReport:
    """Sends `requests` (`make_requests`) to the server at `url` from
    `clients` concurrent clients, then checks them against `model` (the
    same checkpoint and options, offline; `max_model_len`: the server's).
    `state()` says what the server holds ({"running", "waiting",
    "blocks_in_use", ...}), `rss()` its resident memory in bytes (None: not
    checked)."""
    report = SoakReport(requests, 0.0, max_rss_growth=max_rss_growth)

    def warm():
        if rss is not None:
            report.rss_before = rss()

    report.seconds = asyncio.run(_drive(url, requests, clients, warm))
    # Hung-up requests end at the engine's next step: wait for that.
    deadline = time.monotonic() + settle_seconds
    while True:
        report.final_state = state()
        if not any(report.final_state.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if rss is not None:
        report.rss_after = rss()
    _check(report, model, max_model_len)
    return report


def _check(report: SoakReport, model, max_model_len: int) -> None:
    from etc.models.step.sampling import SamplingParams

    fail = report.failures.append
    for key, value in report.final_state.items():
        if value:
            fail(f"after the soak the server still has {key} = {value}")
    growth = report.rss_growth
    if growth is not None and growth >= report.max_rss_growth:
        fail(f"the server's memory grew by {growth:.1%} ({report.rss_before} -> "
             f"{report.rss_after} bytes)")
    for r in report.requests:
        where = f"request {r.index} ({r.kind}, {r.route})"
        if r.kind == "malformed":
            if r.status != r.expect_status or (r.error or {}).get("param") != r.expect_param:
                fail(f"{where}: {r.status} {r.error}, expected {r.expect_status} naming "
                     f"{r.expect_param!r}")
            continue
        if r.kind == "disconnect":
            continue
        if r.status != 200 or (r.error and r.kind == "ok"):
            fail(f"{where}: {r.status} {r.error}")
            continue
        if r.kind == "cancel":
            continue
        body = r.body
        if r.finish_reason not in ("stop", "length"):
            fail(f"{where}: finish_reason {r.finish_reason!r}")
            continue
        usage = r.usage
        if usage is not None:
            if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
                fail(f"{where}: usage does not add up: {usage}")
            if usage["completion_tokens"] > body.get("max_tokens", 10 ** 9):
                fail(f"{where}: {usage['completion_tokens']} tokens, max_tokens "
                     f"{body['max_tokens']}")
        seeded = body["temperature"] == 0.0 or "seed" in body
        if not seeded or (usage is None and "max_tokens" not in body):
            continue
        prompt = body["messages"] if "messages" in body else body["prompt"]
        sampling = None
        if body["temperature"]:
            sampling = SamplingParams(**{k: body[k] for k in ("temperature", "seed", "top_p",
                                                               "top_k", "min_p") if k in body})
        # Without max_tokens: up to the model length, as the server did.
        new = body.get("max_tokens") or max_model_len - usage["prompt_tokens"]
        want = model.generate([prompt], new, stop=body.get("stop"),
                              ignore_eos=body.get("ignore_eos", False), sampling=sampling)
        report.checked_offline += 1
        got = (r.text, r.finish_reason, None if usage is None else usage["completion_tokens"])
        expected = (want.text[0], want.finish_reasons[0],
                    None if usage is None else len(want.tokens[0]))
        if got != expected:
            fail(f"{where}: {got!r} differs from offline generate {expected!r} "
                 f"(body {json.dumps(body)[:300]})")

