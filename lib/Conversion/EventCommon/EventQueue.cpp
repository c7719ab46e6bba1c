//===- EventQueue.cpp - The task queue protocol shared by the targets -----===//

#include "Conversion/EventCommon/EventQueue.h"

#include "Conversion/EventCommon/EventAddressing.h"
#include "Event/IR/QueueLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc;
namespace queue = etc::event::queue;

/// The address of word `word` (an index) of the queue at `queueStart`.
static Value queueWord(OpBuilder &b, Location loc, Value counters,
                       Value queueStart, Value word) {
  return getCounterPointer(
      b, loc, counters,
      arith::AddIOp::create(b, loc, queueStart, word).getResult());
}

static Value constantIndex(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

Value etc::buildClaim(OpBuilder &b, Location loc, Value counters, Value index,
                      StringRef syncScope) {
  Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
  Value previous = LLVM::AtomicRMWOp::create(
      b, loc, LLVM::AtomicBinOp::add, getCounterPointer(b, loc, counters, index),
      one, LLVM::AtomicOrdering::monotonic, syncScope, /*alignment=*/4);
  return arith::IndexCastUIOp::create(b, loc, b.getIndexType(), previous);
}

/// Atomically adds 1 to the i32 header word `word` and returns its old value
/// as an index. Relaxed: the slot's release/acquire pair synchronises.
static Value claim(OpBuilder &b, Location loc, Value counters, Value queueStart,
                   int64_t word, StringRef syncScope) {
  return buildClaim(
      b, loc, counters,
      arith::AddIOp::create(b, loc, queueStart, constantIndex(b, loc, word)),
      syncScope);
}

/// The address of slot `slot` (an index).
static Value slotPointer(OpBuilder &b, Location loc, Value counters,
                         Value queueStart, Value slot) {
  Value word = arith::AddIOp::create(
      b, loc, slot, constantIndex(b, loc, queue::kHeaderWords));
  return queueWord(b, loc, counters, queueStart, word);
}

static void storeI32(OpBuilder &b, Location loc, Value value, Value pointer,
                     LLVM::AtomicOrdering ordering, StringRef syncScope) {
  LLVM::StoreOp::create(b, loc, value, pointer, /*alignment=*/4,
                        /*isVolatile=*/false, /*isNonTemporal=*/false,
                        /*isInvariantGroup=*/false, ordering, syncScope);
}

void etc::buildQueuePush(
    OpBuilder &builder, Location loc, Value counters, Value queueStart,
    Value capacity, Value task, StringRef syncScope,
    function_ref<void(OpBuilder &, Location, Value)> afterPublish) {
  Value slot = claim(builder, loc, counters, queueStart, queue::kTailWord,
                     syncScope);
  Value fits = arith::CmpIOp::create(builder, loc, arith::CmpIPredicate::ult,
                                     slot, capacity);
  scf::IfOp::create(
      builder, loc, fits,
      [&](OpBuilder &b, Location loc) {
        Value published = arith::IndexCastUIOp::create(
            b, loc, b.getI32Type(),
            arith::AddIOp::create(b, loc, task, constantIndex(b, loc, 1)));
        Value pointer = slotPointer(b, loc, counters, queueStart, slot);
        storeI32(b, loc, published, pointer, LLVM::AtomicOrdering::release,
                 syncScope);
        if (afterPublish)
          afterPublish(b, loc, pointer);
        scf::YieldOp::create(b, loc);
      },
      [&](OpBuilder &b, Location loc) {
        Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
        Value error = queueWord(b, loc, counters, queueStart,
                                constantIndex(b, loc, queue::kErrorWord));
        storeI32(b, loc, one, error, LLVM::AtomicOrdering::monotonic,
                 syncScope);
        scf::YieldOp::create(b, loc);
      });
}

Value etc::buildQueuePop(
    OpBuilder &builder, Location loc, Value counters, Value queueStart,
    Value capacity, StringRef syncScope,
    function_ref<Value(OpBuilder &, Location, Value, Value)> waitForSlot) {
  Value slot = claim(builder, loc, counters, queueStart, queue::kHeadWord,
                     syncScope);
  Value fits = arith::CmpIOp::create(builder, loc, arith::CmpIPredicate::ult,
                                     slot, capacity);
  auto result = scf::IfOp::create(
      builder, loc, fits,
      [&](OpBuilder &b, Location loc) {
        Value published = waitForSlot(
            b, loc, slotPointer(b, loc, counters, queueStart, slot), slot);
        Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
        scf::YieldOp::create(b, loc,
                             ValueRange{arith::SubIOp::create(b, loc, published,
                                                              one)});
      },
      [&](OpBuilder &b, Location loc) {
        scf::YieldOp::create(
            b, loc,
            ValueRange{arith::IndexCastUIOp::create(b, loc, b.getI32Type(),
                                                    capacity)});
      });
  return result.getResult(0);
}

Value etc::buildQueueTryPop(OpBuilder &builder, Location loc, Value counters,
                            Value queueStart, Value capacity,
                            StringRef syncScope, bool acquireOnTake) {
  Type i1 = builder.getI1Type(), i32 = builder.getI32Type();
  Value capacity32 = arith::IndexCastUIOp::create(builder, loc, i32, capacity);
  Value one = arith::ConstantIntOp::create(builder, loc, 1, 32);
  Value nothingYet = arith::AddIOp::create(builder, loc, capacity32, one);
  Value headPointer = queueWord(builder, loc, counters, queueStart,
                                constantIndex(builder, loc, queue::kHeadWord));
  auto loop = scf::WhileOp::create(
      builder, loc, TypeRange{i32}, ValueRange{},
      [&](OpBuilder &b, Location loc, ValueRange) {
        Value head = LLVM::LoadOp::create(
            b, loc, i32, headPointer, /*alignment=*/4, /*isVolatile=*/false,
            /*isNonTemporal=*/false, /*isInvariant=*/false,
            /*isInvariantGroup=*/false, LLVM::AtomicOrdering::monotonic,
            syncScope);
        Value exhausted = arith::CmpIOp::create(
            b, loc, arith::CmpIPredicate::uge, head, capacity32);
        // (retry, result)
        auto outcome = scf::IfOp::create(
            b, loc, exhausted,
            [&](OpBuilder &then, Location loc) {
              scf::YieldOp::create(
                  then, loc,
                  ValueRange{arith::ConstantIntOp::create(then, loc, 0, 1),
                             capacity32});
            },
            [&](OpBuilder &open, Location loc) {
              Value slot = arith::IndexCastUIOp::create(
                  open, loc, open.getIndexType(), head);
              Value published = LLVM::LoadOp::create(
                  open, loc, i32,
                  slotPointer(open, loc, counters, queueStart, slot),
                  /*alignment=*/4, /*isVolatile=*/false,
                  /*isNonTemporal=*/false, /*isInvariant=*/false,
                  /*isInvariantGroup=*/false,
                  acquireOnTake ? LLVM::AtomicOrdering::monotonic
                                : LLVM::AtomicOrdering::acquire,
                  syncScope);
              Value empty = arith::CmpIOp::create(
                  open, loc, arith::CmpIPredicate::eq, published,
                  arith::ConstantIntOp::create(open, loc, 0, 32));
              auto take = scf::IfOp::create(
                  open, loc, empty,
                  [&](OpBuilder &then, Location loc) {
                    scf::YieldOp::create(
                        then, loc,
                        ValueRange{arith::ConstantIntOp::create(then, loc, 0, 1),
                                   nothingYet});
                  },
                  [&](OpBuilder &full, Location loc) {
                    // The slot is written once: the value loaded is the
                    // task of whoever advances the head from `head`.
                    auto exchange = LLVM::AtomicCmpXchgOp::create(
                        full, loc, headPointer, head,
                        arith::AddIOp::create(full, loc, head, one),
                        LLVM::AtomicOrdering::monotonic,
                        LLVM::AtomicOrdering::monotonic, syncScope);
                    Value taken = LLVM::ExtractValueOp::create(
                        full, loc, exchange, ArrayRef<int64_t>{1});
                    Value retry = arith::XOrIOp::create(
                        full, loc, taken,
                        arith::ConstantIntOp::create(full, loc, 1, 1));
                    scf::YieldOp::create(
                        full, loc,
                        ValueRange{retry, arith::SubIOp::create(
                                              full, loc, published, one)
                                              .getResult()});
                  });
              scf::YieldOp::create(open, loc, take.getResults());
            });
        scf::ConditionOp::create(b, loc, outcome.getResult(0),
                                 ValueRange{outcome.getResult(1)});
      },
      [&](OpBuilder &b, Location loc, ValueRange) {
        scf::YieldOp::create(b, loc);
      });
  Value task = loop.getResult(0);
  if (acquireOnTake) {
    // The relaxed load that saw the slot published synchronises with its
    // pusher's release here, once.
    Value took = arith::CmpIOp::create(builder, loc, arith::CmpIPredicate::ult,
                                       task, capacity32);
    scf::IfOp::create(builder, loc, took, [&](OpBuilder &b, Location loc) {
      LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire, syncScope);
      scf::YieldOp::create(b, loc);
    });
  }
  return task;
}

Value etc::exhaustedIfEmpty(OpBuilder &builder, Location loc, Value published,
                            Value capacity) {
  Value zero = arith::ConstantIntOp::create(builder, loc, 0, 32);
  Value empty = arith::CmpIOp::create(builder, loc, arith::CmpIPredicate::eq,
                                      published, zero);
  Value past = arith::IndexCastUIOp::create(
      builder, loc, builder.getI32Type(),
      arith::AddIOp::create(builder, loc, capacity,
                            constantIndex(builder, loc, 1)));
  return arith::SelectOp::create(builder, loc, empty, past, published);
}
