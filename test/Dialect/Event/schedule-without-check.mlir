// RUN: etc-opt %s -event-static-schedule="workers=2 check=false" | FileCheck %s --check-prefix=STATIC
// RUN: etc-opt %s -event-dynamic-schedule="workers=2 check=false" | FileCheck %s --check-prefix=DYNAMIC
// RUN: not etc-opt %s -event-static-schedule=workers=2 2>&1 | FileCheck %s --check-prefix=CHECKED
// RUN: not etc-opt %s -event-dynamic-schedule=workers=2 2>&1 | FileCheck %s --check-prefix=CHECKED

// "produce" notifies each element once but its count says 2: the schedule
// check rejects the graph. With check=false both schedulers still build the
// program (for tests of the runtime's watchdog): the static worker waits
// forever on "consume"'s elements, the dynamic one never gets them from
// the queue.

// CHECKED: error: 'event.alloc' op 'count' cannot be proved equal to the number of notifies each element receives from task 'produce'

// STATIC-LABEL: func.func @hang_worker(
// STATIC-SAME:      event.events = [{name = "e0", notified_by = ["produce"], waited_by = ["consume"]}]
// STATIC:         event.notify
// STATIC:         event.wait %{{.*}}[%[[I:.*]]] site(%{{.*}}, %{{.*}}, %[[I]]) deferred : !event.tensor<?>

// DYNAMIC-LABEL: func.func @hang_worker(
// DYNAMIC:         event.queue_pop
// DYNAMIC:         event.notify_ready
event.graph @hang(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
  %c2 = arith.constant 2 : index
  %e = event.alloc(%n) count(%c2) : !event.tensor<?>
  event.task "produce" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "consume" grid(%n)
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}
