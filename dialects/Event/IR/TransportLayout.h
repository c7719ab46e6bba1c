//===- TransportLayout.h - How a program reaches the other ranks -*- C++ -*-===//
//
// A graph that runs on several ranks (`event.ranks`) reaches the others
// through a *transport block* of i64 words in its buffer table, after the
// buffers' descriptors: the scheduled functions carry the word where it
// starts (`kTransportAttrName`) and mark the table (`kTableAttrName`). The
// runtime fills it before each run (python/etc/runtime/distributed.py
// mirrors these numbers); the CPU lowering of `event.rank_id`,
// `event.rank_count`, `event.put` and `event.remote_notify` reads it.
//
// On the CPU every rank is a process and the transport is MPI one-sided
// communication: the counter buffer and the symmetric buffers lie in one MPI
// window (allocated with `MPI_Win_allocate`, the same layout on every rank),
// and the lowered code calls the MPI library's own functions through the
// pointers below, passing MPI handles as 64-bit words (an `int` handle, as
// MPICH's, or a pointer, as in the standard ABI, both travel in one
// argument register or stack slot on x86-64 and AArch64).
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_IR_TRANSPORTLAYOUT_H
#define ETC_EVENT_IR_TRANSPORTLAYOUT_H

#include "llvm/ADT/StringRef.h"
#include <cstdint>

namespace etc::event::transport {

/// On the scheduled functions of a graph on several ranks: the word of the
/// buffer table where the transport block starts.
inline constexpr llvm::StringLiteral kTransportAttrName = "event.transport";
/// The unit argument attribute marking the buffer table of such a function.
inline constexpr llvm::StringLiteral kTableAttrName = "event.table";

// Words of the transport block, relative to its first word.
inline constexpr int64_t kRankWord = 0;      ///< This process's rank.
inline constexpr int64_t kRankCountWord = 1; ///< The number of ranks.
inline constexpr int64_t kWindowWord = 2;    ///< The MPI_Win handle.
inline constexpr int64_t kBaseWord = 3;      ///< The window's local address.
inline constexpr int64_t kPutWord = 4;       ///< &MPI_Put
inline constexpr int64_t kAccumulateWord = 5; ///< &MPI_Accumulate
inline constexpr int64_t kFlushWord = 6;     ///< &MPI_Win_flush
inline constexpr int64_t kByteWord = 7;      ///< The MPI_BYTE handle.
inline constexpr int64_t kIntWord = 8;       ///< The MPI_INT handle.
inline constexpr int64_t kSumWord = 9;       ///< The MPI_SUM handle.
inline constexpr int64_t kWords = 10;

} // namespace etc::event::transport

#endif // ETC_EVENT_IR_TRANSPORTLAYOUT_H
