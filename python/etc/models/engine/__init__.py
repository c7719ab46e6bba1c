"""The engine: many concurrent requests on one compiled model, batched
continuously (`engine.Engine`); a request's handle, outputs and result
(`requests`); its state while it runs (`sequence`); the KV cache's slots
and blocks as the scheduler sees them (`slots`); stop strings (`stopping`);
speculative decoding's proposals and their verification (`speculative`, a
draft model's: `draft`); and rank 0 leading the other ranks of a
tensor-parallel model through the same steps (`lockstep`)."""

from __future__ import annotations

from .engine import Engine, EngineStats, StepRecord
from .requests import RequestError, RequestHandle, RequestOutput, RequestResult, TokenLogprobs
from .slots import PagedSlots, SlotCache
from .speculative import Speculative
from .stopping import StopChecker

__all__ = ["Engine", "EngineStats", "StepRecord", "RequestError", "RequestHandle",
           "RequestOutput", "RequestResult", "PagedSlots", "SlotCache", "Speculative",
           "StopChecker", "TokenLogprobs"]
