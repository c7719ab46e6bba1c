// RUN: etc-opt %s -convert-event-to-gpu -verify-diagnostics

// The polling worker of the dynamic schedule on several ranks has no GPU
// lowering yet: the conversion says so.

func.func @g_worker(%counters: memref<?xi32>, %n: index, %q: index) -> index
    attributes {event.graph = "g", event.schedule = "dynamic", event.workers = 2 : i64} {
  // expected-error @+1 {{'event.queue_try_pop' op is not lowered for GPUs yet: the dynamic schedule of a graph on several ranks runs on the CPU target only; use the static schedule}}
  %t = event.queue_try_pop %counters[%q] capacity(%n) : memref<?xi32>
  return %t : index
}
