"""A short soak of the server (bench/serve_soak.py, which `bench/serve.py
--soak` runs at length): 60 requests from 4 clients at once, mixed (chat and
text, greedy and sampled, stop strings, streamed or not, cancellations,
disconnects, malformed ones), on a KV cache small enough to preempt. Every
answer is checked afterwards (greedy and seeded ones against
`Model.generate`), and nothing is left held."""

import importlib.util
import sys
from pathlib import Path

import etc.serve
from etc.models.engine import Engine
from test_serve import Server

_PATH = Path(__file__).resolve().parents[2] / "bench" / "serve_soak.py"
_SPEC = importlib.util.spec_from_file_location("serve_soak", _PATH)
serve_soak = sys.modules["serve_soak"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(serve_soak)


def test_a_short_soak(chat_model):
    engine = Engine(chat_model, max_num_seqs=4, kv_cache_tokens=128)
    server = Server(etc.serve.build_app(chat_model, served_model_name="soak", engine=engine))
    try:
        requests = serve_soak.make_requests(
            60, name="soak", tokenizer=chat_model.tokenizer, vocab=chat_model.config.vocab_size,
            max_model_len=engine.max_model_len, seconds=0, malformed=0.1, cancels=0.1,
            disconnects=0.05, seed=1)
        report = serve_soak.soak(
            server.url, chat_model, requests, clients=4, max_model_len=engine.max_model_len,
            state=lambda: {"running": engine.num_running, "waiting": engine.num_waiting,
                           "slots in use": engine.slots_in_use,
                           "blocks in use": engine.blocks_in_use})
    finally:
        server.stop()
    assert report.failures == [], "\n".join(report.lines())
    counts = report.counts()
    assert counts["malformed"] >= 3 and counts["cancel"] >= 3 and counts["ok"] >= 40
    assert report.checked_offline >= 15
    assert engine.stats.preemptions > 0  # the cache was too small for all at once
