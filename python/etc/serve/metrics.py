"""Prometheus metrics of a server (`GET /metrics`), in a registry of its
own so that several apps in one process (tests) do not collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from ..models.engine import Engine, RequestResult

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """Time to first token and per output token (histograms, observed as
    requests finish), requests running and waiting, KV slots and (paged)
    blocks in use (gauges read from the engine at scrape time), requests by
    finish reason and token counts (counters); speculative decoding's
    verification steps, proposed and accepted tokens (counters read from
    the engine's stats at scrape time) and its acceptance rate and
    accepted tokens per step (gauges)."""

    def __init__(self, engine: Engine, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.time_to_first_token = Histogram(
            "etc_time_to_first_token_seconds", "Seconds from arrival to the first new token.",
            labels, registry=r, buckets=_LATENCY_BUCKETS).labels(model_name)
        self.time_per_output_token = Histogram(
            "etc_time_per_output_token_seconds",
            "Seconds per new token after the first, per request.", labels, registry=r,
            buckets=_LATENCY_BUCKETS).labels(model_name)
        self.e2e_latency = Histogram(
            "etc_e2e_request_latency_seconds", "Seconds from arrival to the last token.",
            labels, registry=r, buckets=_LATENCY_BUCKETS).labels(model_name)
        self._finished = Counter("etc_requests", "Finished requests, by finish reason.",
                                 labels + ["finish_reason"], registry=r)
        self._model = model_name
        self.prompt_tokens = Counter("etc_prompt_tokens", "Prompt tokens prefilled.", labels,
                                     registry=r).labels(model_name)
        self.cached_prompt_tokens = Counter(
            "etc_prompt_tokens_cached", "Prompt tokens whose keys and values came from the "
            "paged cache's cached prefixes.", labels, registry=r).labels(model_name)
        self.generation_tokens = Counter("etc_generation_tokens", "New tokens generated.",
                                         labels, registry=r).labels(model_name)
        for name, doc, read in (
                ("etc_num_requests_running", "Requests in the running batch.",
                 lambda: engine.num_running),
                ("etc_num_requests_waiting", "Requests waiting for a KV slot.",
                 lambda: engine.num_waiting),
                ("etc_kv_slots_in_use", "KV cache slots held by requests.",
                 lambda: engine.slots_in_use),
                ("etc_kv_slots_total", "KV cache slots (max_num_seqs).",
                 lambda: engine.max_num_seqs),
                ("etc_num_preemptions", "Requests preempted (their KV blocks freed, "
                 "recomputed later) since the start.", lambda: engine.stats.preemptions)):
            Gauge(name, doc, labels, registry=r).labels(model_name).set_function(read)
        if engine.blocks_total is not None:
            for name, doc, read in (
                    ("etc_kv_blocks_in_use", "Blocks of the paged KV cache held by requests.",
                     lambda: engine.blocks_in_use),
                    ("etc_kv_blocks_total", "Blocks of the paged KV cache.",
                     lambda: engine.blocks_total)):
                Gauge(name, doc, labels, registry=r).labels(model_name).set_function(read)

        r.register(_SpeculationCounts(engine, model_name))
        for name, doc, read in (
                ("etc_spec_decode_acceptance_rate", "Proposed tokens accepted, as a fraction "
                 "of those proposed, since the start (NaN before any).",
                 lambda: engine.stats.acceptance_rate),
                ("etc_spec_decode_accepted_tokens_per_step", "Tokens accepted per "
                 "verification step since the start (NaN before any).",
                 lambda: engine.stats.accepted_tokens_per_step)):
            Gauge(name, doc, labels, registry=r).labels(model_name).set_function(read)

    def observe(self, result: RequestResult) -> None:
        """Called by the engine (its thread) as each request finishes."""
        self._finished.labels(self._model, result.finish_reason).inc()
        self.prompt_tokens.inc(len(result.prompt_ids))
        self.cached_prompt_tokens.inc(result.cached_tokens)
        self.generation_tokens.inc(len(result.token_ids))
        if result.time_to_first_token is not None:
            self.time_to_first_token.observe(result.time_to_first_token)
            self.e2e_latency.observe(result.finish_time - result.arrival_time)
        if result.time_per_output_token is not None:
            self.time_per_output_token.observe(result.time_per_output_token)


class _SpeculationCounts:
    """The engine's speculative decoding counts as Prometheus counters,
    read at scrape time (they grow with every step, not as requests end)."""

    COUNTS = (("etc_spec_decode_num_drafts", "Verification steps: a request's proposed "
               "tokens checked by one step.", "speculative_steps"),
              ("etc_spec_decode_num_draft_tokens", "Tokens proposed.", "proposed_tokens"),
              ("etc_spec_decode_num_accepted_tokens", "Proposed tokens the model accepted.",
               "accepted_tokens"))

    def __init__(self, engine: Engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        for name, doc, field in self.COUNTS:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], getattr(self.engine.stats, field))
            yield family
