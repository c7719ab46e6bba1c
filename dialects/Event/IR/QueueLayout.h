//===- QueueLayout.h - Words of the task queue ------------------*- C++ -*-===//
//
// The layout of the task queue in the counter buffer, as `event.queue_push`
// and `event.queue_pop` define it; the scheduler that allocates the queue
// and every target that lowers the ops use these names.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_IR_QUEUELAYOUT_H
#define ETC_EVENT_IR_QUEUELAYOUT_H

#include <cstdint>

namespace etc::event::queue {

/// Number of slots claimed by pops.
inline constexpr int64_t kHeadWord = 0;
/// Number of slots reserved by pushes.
inline constexpr int64_t kTailWord = 1;
/// Set to 1 when a push finds the queue full.
inline constexpr int64_t kErrorWord = 2;
/// Words before the first slot; slot `s` is word `kHeaderWords + s`.
inline constexpr int64_t kHeaderWords = 3;

} // namespace etc::event::queue

#endif // ETC_EVENT_IR_QUEUELAYOUT_H
