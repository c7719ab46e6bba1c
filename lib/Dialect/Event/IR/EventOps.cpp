//===- EventOps.cpp - Operations of the event dialect -----------*- C++ -*-===//

#include "Event/IR/EventOps.h"
#include "Event/IR/RunLayout.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// GraphOp
//===----------------------------------------------------------------------===//

ParseResult GraphOp::parse(OpAsmParser &parser, OperationState &result) {
  auto buildFuncType = [](Builder &builder, ArrayRef<Type> argTypes,
                          ArrayRef<Type> results,
                          function_interface_impl::VariadicFlag,
                          std::string &) {
    return builder.getFunctionType(argTypes, results);
  };
  if (function_interface_impl::parseFunctionOp(
          parser, result, /*allowVariadic=*/false,
          getFunctionTypeAttrName(result.name), buildFuncType,
          getArgAttrsAttrName(result.name), getResAttrsAttrName(result.name)))
    return failure();
  Region &body = *result.regions.front();
  if (body.empty())
    return parser.emitError(parser.getNameLoc(),
                            "expects a body region with the tasks");
  GraphOp::ensureTerminator(body, parser.getBuilder(), result.location);
  return success();
}

void GraphOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printer.printSymbolName(getSymName());
  function_interface_impl::printFunctionSignature(
      printer, *this, getArgumentTypes(), /*isVariadic=*/false,
      getResultTypes());
  function_interface_impl::printFunctionAttributes(
      printer, *this,
      {getFunctionTypeAttrName(), getArgAttrsAttrName(), getResAttrsAttrName()});
  printer << ' ';
  printer.printRegion(getBody(), /*printEntryBlockArgs=*/false,
                      /*printBlockTerminators=*/false);
}

LogicalResult GraphOp::verify() {
  if (Attribute ranks = (*this)->getAttr(getRanksAttrName())) {
    auto count = dyn_cast<IntegerAttr>(ranks);
    if (!count || count.getInt() < 1)
      return emitOpError("attribute '")
             << getRanksAttrName()
             << "' must be a positive integer (the number of devices), found "
             << ranks;
  }
  if (!getResultTypes().empty())
    return emitOpError("returns nothing: outputs are written to buffer "
                       "arguments, but found ")
           << getResultTypes().size() << " result types";
  for (auto [index, type] : llvm::enumerate(getArgumentTypes())) {
    if (!isa<IndexType, MemRefType>(type))
      return emitOpError("argument #")
             << index << " must be a memref buffer or an index dimension, "
             << "found " << type;
    if (Attribute symmetric = getArgAttr(index, getSymmetricAttrName())) {
      if (!isa<UnitAttr>(symmetric))
        return emitOpError("argument #")
               << index << " attribute '" << getSymmetricAttrName()
               << "' must be a unit attribute";
      if (!isIntermediate(index))
        return emitOpError("argument #")
               << index << " is marked '" << getSymmetricAttrName()
               << "' but not '" << getIntermediateAttrName()
               << "': the runtime allocates symmetric buffers on every rank";
      if (!getRanksAttr())
        return emitOpError("argument #")
               << index << " is marked '" << getSymmetricAttrName()
               << "' but the graph has no '" << getRanksAttrName() << "'";
    }
    Attribute intermediate = getArgAttr(index, getIntermediateAttrName());
    if (!intermediate)
      continue;
    if (!isa<UnitAttr>(intermediate))
      return emitOpError("argument #")
             << index << " attribute '" << getIntermediateAttrName()
             << "' must be a unit attribute";
    if (!isa<MemRefType>(type))
      return emitOpError("argument #")
             << index << " is marked '" << getIntermediateAttrName()
             << "' but is not a memref buffer";
  }
  return success();
}

/// Reports a cycle in the task-level event dependencies, if there is one.
/// An edge runs from each task that notifies an event to each task that
/// waits on it.
static LogicalResult verifyAcyclic(MutableArrayRef<TaskOp> tasks) {
  llvm::DenseMap<Value, SmallVector<unsigned>> notifiers;
  llvm::DenseMap<Operation *, unsigned> taskIndex;
  for (auto [index, task] : llvm::enumerate(tasks)) {
    taskIndex[task] = index;
    for (Value event : task.getNotifies())
      notifiers[event].push_back(index);
  }
  // successors[p] = tasks that wait on something p notifies.
  SmallVector<llvm::SetVector<unsigned>> successors(tasks.size());
  for (auto [index, task] : llvm::enumerate(tasks))
    for (Value event : task.getWaits())
      for (unsigned producer : notifiers.lookup(event))
        successors[producer].insert(index);

  enum class Mark { Unvisited, Active, Done };
  SmallVector<Mark> marks(tasks.size(), Mark::Unvisited);
  SmallVector<unsigned> path;
  std::function<std::optional<unsigned>(unsigned)> visit =
      [&](unsigned node) -> std::optional<unsigned> {
    marks[node] = Mark::Active;
    path.push_back(node);
    for (unsigned next : successors[node]) {
      if (marks[next] == Mark::Active)
        return next;
      if (marks[next] == Mark::Unvisited)
        if (auto start = visit(next))
          return start;
    }
    path.pop_back();
    marks[node] = Mark::Done;
    return std::nullopt;
  };
  for (unsigned root = 0; root < tasks.size(); ++root) {
    if (marks[root] != Mark::Unvisited)
      continue;
    std::optional<unsigned> start = visit(root);
    if (!start)
      continue;
    auto diag = tasks[*start].emitOpError("is part of a dependency cycle: ");
    auto begin = llvm::find(path, *start);
    for (auto it = begin; it != path.end(); ++it)
      diag << "'" << tasks[*it].getName() << "' -> ";
    diag << "'" << tasks[*start].getName() << "'";
    return diag;
  }
  return success();
}

LogicalResult GraphOp::verifyRegions() {
  SmallVector<TaskOp> tasks(getBody().getOps<TaskOp>());

  llvm::StringMap<TaskOp> names;
  for (TaskOp task : tasks) {
    auto [it, inserted] = names.try_emplace(task.getName(), task);
    if (!inserted)
      return task.emitOpError("name '")
             << task.getName() << "' is already used by another task";
  }

  // Intermediate buffers must be written by an earlier task before a read.
  llvm::SmallDenseSet<Value> written;
  for (TaskOp task : tasks) {
    for (auto [index, buffer] : llvm::enumerate(task.getReads())) {
      auto arg = dyn_cast<BlockArgument>(buffer);
      // Symmetric buffers are written by other ranks' puts, ordered by the
      // symmetric events the reading task waits on.
      if (!arg || arg.getOwner() != &getBody().front() ||
          !isIntermediate(arg.getArgNumber()) ||
          isSymmetric(arg.getArgNumber()) || written.contains(buffer))
        continue;
      return task.emitOpError("reads intermediate buffer argument #")
             << arg.getArgNumber() << " (read #" << index
             << ") that no earlier task writes";
    }
    for (Value buffer : task.getWrites())
      written.insert(buffer);
  }

  // Every waited event is notified by some task.
  llvm::SmallDenseSet<Value> notified;
  for (TaskOp task : tasks)
    for (Value event : task.getNotifies())
      notified.insert(event);
  for (TaskOp task : tasks)
    for (auto [index, event] : llvm::enumerate(task.getWaits()))
      if (!notified.contains(event))
        return task.emitOpError("waits on an event that no task notifies "
                                "(wait #")
               << index << ")";

  return verifyAcyclic(tasks);
}

//===----------------------------------------------------------------------===//
// AllocOp
//===----------------------------------------------------------------------===//

/// Checks that `value`, when it is a constant, is not negative: `what` is
/// the operand's role in the message.
static LogicalResult verifyNotNegative(Operation *op, Value value,
                                       StringRef what) {
  APInt constant;
  if (!value || !matchPattern(value, m_ConstantInt(&constant)) ||
      !constant.isNegative())
    return success();
  return op->emitOpError("expects a non-negative ")
         << what << ", found " << constant.getSExtValue();
}

/// Checks that `sizes` supplies one value per `?` dimension of `type`, none
/// of them a negative constant.
static LogicalResult verifyDynamicSizes(Operation *op, EventTensorType type,
                                        ValueRange sizes) {
  unsigned expected = type.getNumDynamicDims();
  if (sizes.size() != expected)
    return op->emitOpError("expects ")
           << expected << " dynamic sizes for the '?' dimensions of " << type
           << ", found " << sizes.size();
  for (Value size : sizes)
    if (failed(verifyNotNegative(op, size, "dynamic size")))
      return failure();
  return success();
}

LogicalResult AllocOp::verify() {
  if (failed(verifyNotNegative(*this, getCount(), "expected count")))
    return failure();
  if (getType().getSymmetric()) {
    auto graph = (*this)->getParentOfType<GraphOp>();
    if (graph && !graph.getRanksAttr())
      return emitOpError("allocates a symmetric event tensor in a graph "
                         "without '")
             << GraphOp::getRanksAttrName() << "'";
    if (!getCount())
      return emitOpError("allocates a symmetric event tensor without "
                         "'count': notifies from other ranks cannot be "
                         "counted on this one");
  }
  return verifyDynamicSizes(*this, getType(), getDynamicSizes());
}

//===----------------------------------------------------------------------===//
// ViewOp
//===----------------------------------------------------------------------===//

LogicalResult ViewOp::verify() {
  if (failed(verifyNotNegative(*this, getOffset(), "offset into the counters")))
    return failure();
  return verifyDynamicSizes(*this, getType(), getDynamicSizes());
}

//===----------------------------------------------------------------------===//
// TaskOp
//===----------------------------------------------------------------------===//

void TaskOp::build(OpBuilder &builder, OperationState &state, StringRef name,
                   ValueRange grid) {
  state.addOperands(grid);
  Properties &props = state.getOrAddProperties<Properties>();
  props.name = builder.getStringAttr(name);
  props.read_footprints = builder.getArrayAttr({});
  props.write_footprints = builder.getArrayAttr({});
  props.wait_maps = builder.getArrayAttr({});
  props.notify_maps = builder.getArrayAttr({});
  props.operandSegmentSizes = {static_cast<int32_t>(grid.size()), 0, 0, 0, 0, 0};
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  for (size_t dim = 0; dim < grid.size(); ++dim)
    block->addArgument(builder.getIndexType(), state.location);
  TaskOp::ensureTerminator(*body, builder, state.location);
}

void TaskOp::addWait(Value event, IndexMapAttr map) {
  getWaitsMutable().append(event);
  SmallVector<Attribute> maps(getWaitMaps().getValue());
  maps.push_back(map);
  setWaitMapsAttr(ArrayAttr::get(getContext(), maps));
}

void TaskOp::addNotify(Value event, IndexMapAttr map) {
  getNotifiesMutable().append(event);
  SmallVector<Attribute> maps(getNotifyMaps().getValue());
  maps.push_back(map);
  setNotifyMapsAttr(ArrayAttr::get(getContext(), maps));
}

namespace {
/// The clauses of `event.task` in the order they are printed and parsed.
/// `attr` is the per-operand attribute list the clause carries, if any.
enum class ClauseKind { Footprint, IndexMap, Plain };
} // namespace

/// Parses `keyword(%v : type <attr-body>, ...)` if the keyword is present.
static ParseResult
parseClause(OpAsmParser &parser, StringRef keyword, ClauseKind kind,
            SmallVectorImpl<OpAsmParser::UnresolvedOperand> &operands,
            SmallVectorImpl<Type> &types, SmallVectorImpl<Attribute> &attrs) {
  if (failed(parser.parseOptionalKeyword(keyword)))
    return success();
  return parser.parseCommaSeparatedList(
      OpAsmParser::Delimiter::Paren, [&]() -> ParseResult {
        OpAsmParser::UnresolvedOperand operand;
        Type type;
        if (parser.parseOperand(operand) || parser.parseColonType(type))
          return failure();
        operands.push_back(operand);
        types.push_back(type);
        if (kind == ClauseKind::Plain)
          return success();
        // Verified by TaskOp::verify, whose messages name the clause.
        Attribute attr = kind == ClauseKind::Footprint
                             ? FootprintAttr::parseBody(parser, /*verify=*/false)
                             : IndexMapAttr::parseBody(parser, /*verify=*/false);
        if (!attr)
          return failure();
        attrs.push_back(attr);
        return success();
      });
}

ParseResult TaskOp::parse(OpAsmParser &parser, OperationState &result) {
  Builder &builder = parser.getBuilder();
  StringAttr name;
  SmallVector<OpAsmParser::UnresolvedOperand> grid;
  if (parser.parseAttribute(name) || parser.parseKeyword("grid") ||
      parser.parseOperandList(grid, OpAsmParser::Delimiter::Paren))
    return failure();

  SmallVector<OpAsmParser::UnresolvedOperand> reads, writes, waits, notifies,
      indices;
  SmallVector<Type> readTypes, writeTypes, waitTypes, notifyTypes, indexTypes;
  SmallVector<Attribute> readFootprints, writeFootprints, waitMaps, notifyMaps,
      unused;
  SMLoc operandsLoc = parser.getCurrentLocation();
  if (parseClause(parser, "reads", ClauseKind::Footprint, reads, readTypes,
                  readFootprints) ||
      parseClause(parser, "writes", ClauseKind::Footprint, writes, writeTypes,
                  writeFootprints) ||
      parseClause(parser, "waits", ClauseKind::IndexMap, waits, waitTypes,
                  waitMaps) ||
      parseClause(parser, "notifies", ClauseKind::IndexMap, notifies,
                  notifyTypes, notifyMaps) ||
      parseClause(parser, "indices", ClauseKind::Plain, indices, indexTypes,
                  unused))
    return failure();
  SmallVector<Attribute> liveBounds;
  if (succeeded(parser.parseOptionalKeyword("live")) &&
      parser.parseCommaSeparatedList(
          OpAsmParser::Delimiter::Paren, [&]() -> ParseResult {
            // Verified by TaskOp::verify, whose messages name the bound.
            Attribute bound = LiveAttr::parseBody(parser, /*verify=*/false);
            if (!bound)
              return failure();
            liveBounds.push_back(bound);
            return success();
          }))
    return failure();

  if (parser.resolveOperands(grid, builder.getIndexType(), result.operands) ||
      parser.resolveOperands(reads, readTypes, operandsLoc, result.operands) ||
      parser.resolveOperands(writes, writeTypes, operandsLoc,
                             result.operands) ||
      parser.resolveOperands(waits, waitTypes, operandsLoc, result.operands) ||
      parser.resolveOperands(notifies, notifyTypes, operandsLoc,
                             result.operands) ||
      parser.resolveOperands(indices, indexTypes, operandsLoc,
                             result.operands))
    return failure();

  Properties &props = result.getOrAddProperties<Properties>();
  props.name = name;
  props.read_footprints = builder.getArrayAttr(readFootprints);
  props.write_footprints = builder.getArrayAttr(writeFootprints);
  props.wait_maps = builder.getArrayAttr(waitMaps);
  props.notify_maps = builder.getArrayAttr(notifyMaps);
  if (!liveBounds.empty())
    props.live_bounds = builder.getArrayAttr(liveBounds);
  props.operandSegmentSizes = {
      static_cast<int32_t>(grid.size()),     static_cast<int32_t>(reads.size()),
      static_cast<int32_t>(writes.size()),   static_cast<int32_t>(waits.size()),
      static_cast<int32_t>(notifies.size()), static_cast<int32_t>(indices.size())};

  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  Region *body = result.addRegion();
  if (parser.parseRegion(*body, /*arguments=*/{}))
    return failure();
  if (body->empty())
    return parser.emitError(parser.getNameLoc(),
                            "expects a body region with one block whose "
                            "arguments are the tile indices");
  TaskOp::ensureTerminator(*body, builder, result.location);
  return success();
}

/// Prints `keyword(%v : type <attr-body>, ...)` unless the clause is empty.
static void printClause(OpAsmPrinter &printer, StringRef keyword,
                        OperandRange operands, ArrayAttr attrs) {
  if (operands.empty())
    return;
  printer << ' ' << keyword << '(';
  for (auto [index, operand] : llvm::enumerate(operands)) {
    if (index > 0)
      printer << ", ";
    printer << operand << " : " << operand.getType();
    if (!attrs)
      continue;
    printer << ' ';
    if (auto footprint = dyn_cast<FootprintAttr>(attrs[index]))
      footprint.printBody(printer);
    else
      cast<IndexMapAttr>(attrs[index]).printBody(printer);
  }
  printer << ')';
}

void TaskOp::print(OpAsmPrinter &printer) {
  printer << ' ';
  printer.printAttributeWithoutType(getNameAttr());
  printer << " grid(" << getGrid() << ')';
  printClause(printer, "reads", getReads(), getReadFootprints());
  printClause(printer, "writes", getWrites(), getWriteFootprints());
  printClause(printer, "waits", getWaits(), getWaitMaps());
  printClause(printer, "notifies", getNotifies(), getNotifyMaps());
  printClause(printer, "indices", getIndices(), /*attrs=*/nullptr);
  if (isPredicated()) {
    printer << " live(";
    llvm::interleaveComma(getLiveBoundList(), printer,
                          [&](LiveAttr bound) { bound.printBody(printer); });
    printer << ')';
  }
  printer.printOptionalAttrDictWithKeyword(
      (*this)->getAttrs(),
      {getNameAttrName(), getReadFootprintsAttrName(),
       getWriteFootprintsAttrName(), getWaitMapsAttrName(),
       getNotifyMapsAttrName(), getLiveBoundsAttrName(),
       getOperandSegmentSizesAttrName()});
  printer << ' ';
  printer.printRegion(getBody(), /*printEntryBlockArgs=*/true,
                      /*printBlockTerminators=*/false);
}

/// `map` as text, e.g. `(d0) -> (d0 * 32)`, for diagnostics.
static std::string print(AffineMap map) {
  std::string text;
  llvm::raw_string_ostream(text) << map;
  return text;
}

/// Checks that there is one footprint per buffer and that each matches the
/// grid rank and the buffer rank.
static LogicalResult verifyFootprints(TaskOp task, StringRef clause,
                                      OperandRange buffers,
                                      ArrayAttr footprints) {
  if (buffers.size() != footprints.size())
    return task.emitOpError("has ")
           << buffers.size() << " '" << clause << "' buffers but "
           << footprints.size() << " footprints";
  unsigned gridRank = task.getGridRank();
  for (auto [index, buffer, attr] :
       llvm::enumerate(buffers, footprints.getValue())) {
    auto footprint = cast<FootprintAttr>(attr);
    auto type = cast<MemRefType>(buffer.getType());
    AffineMap offsets = footprint.getOffsets();
    // The clause parser leaves the attribute's own checks to here.
    if (failed(FootprintAttr::verify(
            [&] {
              return task.emitOpError("footprint of ")
                     << clause << " #" << index << " '" << print(offsets)
                     << "': ";
            },
            offsets, footprint.getSizes())))
      return failure();
    if (offsets.getNumDims() != gridRank)
      return task.emitOpError("footprint of ")
             << clause << " #" << index << " has " << offsets.getNumDims()
             << " tile indices but the grid has rank " << gridRank;
    if (offsets.getNumResults() != type.getRank())
      return task.emitOpError("footprint of ")
             << clause << " #" << index << " has " << offsets.getNumResults()
             << " offsets but the buffer has rank " << type.getRank();
  }
  return success();
}

/// Checks that there is one index map per event, that each matches the grid
/// rank and the event rank, and that indirect results name index buffers.
static LogicalResult verifyIndexMaps(TaskOp task, StringRef clause,
                                     OperandRange events, ArrayAttr maps) {
  if (events.size() != maps.size())
    return task.emitOpError("has ")
           << events.size() << " '" << clause << "' events but "
           << maps.size() << " index maps";
  unsigned gridRank = task.getGridRank();
  for (auto [index, event, attr] : llvm::enumerate(events, maps.getValue())) {
    auto indexMap = cast<IndexMapAttr>(attr);
    auto type = cast<EventTensorType>(event.getType());
    AffineMap map = indexMap.getMap();
    // The clause parser leaves the attribute's own checks to here.
    if (failed(IndexMapAttr::verify(
            [&] {
              return task.emitOpError("index map of ")
                     << clause << " #" << index << " '" << print(map) << "': ";
            },
            map, indexMap.getIndirect())))
      return failure();
    if (map.getNumDims() != gridRank)
      return task.emitOpError("index map of ")
             << clause << " #" << index << " has " << map.getNumDims()
             << " tile indices but the grid has rank " << gridRank;
    // A notify of a symmetric event names the rank first; waits are on
    // the waiting rank's own copy.
    bool remote = type.getSymmetric() && clause == "notifies";
    int64_t expected = type.getRank() + (remote ? 1 : 0);
    if (map.getNumResults() != expected)
      return task.emitOpError("index map of ")
             << clause << " #" << index << " has " << map.getNumResults()
             << " results but the event tensor has rank " << type.getRank()
             << (remote ? " (plus the rank of the notified copy)" : "");
    if (remote && indexMap.isIndirect(0))
      return task.emitOpError("index map of ")
             << clause << " #" << index
             << " loads the rank of a symmetric event from an index buffer; "
                "the rank must be affine";
    for (auto [result, buffer] : llvm::enumerate(indexMap.getIndirect()))
      if (buffer >= static_cast<int64_t>(task.getIndices().size()))
        return task.emitOpError("index map of ")
               << clause << " #" << index << " loads result " << result
               << " from index buffer " << buffer << " but the task has "
               << task.getIndices().size() << " index buffers";
  }
  return success();
}

/// Checks each live bound: its maps, that it bounds a tile index of the
/// grid, and that it loads from one of the task's index buffers.
static LogicalResult verifyLiveBounds(TaskOp task) {
  unsigned gridRank = task.getGridRank();
  for (auto [index, bound] : llvm::enumerate(task.getLiveBoundList())) {
    std::string text;
    {
      llvm::raw_string_ostream os(text);
      os << 'd' << bound.getDim() << " below " << bound.getBound() << " of "
         << bound.getPosition().getMap();
    }
    // The clause parser leaves the attribute's own checks to here.
    if (failed(LiveAttr::verify(
            [&] {
              return task.emitOpError("live bound #")
                     << index << " '" << text << "': ";
            },
            bound.getDim(), bound.getBound(), bound.getPosition())))
      return failure();
    if (bound.getDim() >= gridRank)
      return task.emitOpError("live bound #")
             << index << " bounds tile index d" << bound.getDim()
             << " but the grid has rank " << gridRank;
    if (bound.getPosition().getMap().getNumDims() != gridRank)
      return task.emitOpError("live bound #")
             << index << " has a position map with "
             << bound.getPosition().getMap().getNumDims()
             << " tile indices but the grid has rank " << gridRank;
    if (bound.getIndexBuffer() >=
        static_cast<int64_t>(task.getIndices().size()))
      return task.emitOpError("live bound #")
             << index << " loads its value from index buffer "
             << bound.getIndexBuffer() << " but the task has "
             << task.getIndices().size() << " index buffers";
  }
  return success();
}

LogicalResult TaskOp::verify() {
  if (getName().empty())
    return emitOpError("needs a non-empty name");
  // A grid extent may be 0 at run time (a symbol), but a task that can never
  // run is a mistake, and its tiles would size a task queue of capacity 0.
  for (auto [dim, extent] : llvm::enumerate(getGrid())) {
    APInt value;
    if (matchPattern(extent, m_ConstantInt(&value)) && !value.isStrictlyPositive())
      return emitOpError("grid dimension #")
             << dim << " is the constant " << value.getSExtValue()
             << "; a task needs at least one tile";
  }
  if (failed(verifyFootprints(*this, "reads", getReads(), getReadFootprints())) ||
      failed(verifyFootprints(*this, "writes", getWrites(),
                              getWriteFootprints())) ||
      failed(verifyIndexMaps(*this, "waits", getWaits(), getWaitMaps())) ||
      failed(verifyIndexMaps(*this, "notifies", getNotifies(),
                             getNotifyMaps())) ||
      failed(verifyLiveBounds(*this)))
    return failure();
  for (auto [index, buffer] : llvm::enumerate(getIndices())) {
    auto type = cast<MemRefType>(buffer.getType());
    if (type.getRank() != 1 ||
        !isa<IntegerType, IndexType>(type.getElementType()))
      return emitOpError("index buffer #")
             << index << " must be a 1-D memref of integers, found " << type;
  }
  return success();
}

LogicalResult TaskOp::verifyRegions() {
  Block &block = getBodyBlock();
  if (block.getNumArguments() != getGridRank())
    return emitOpError("body has ")
           << block.getNumArguments() << " arguments but the grid has rank "
           << getGridRank() << " (one tile index per grid dimension)";
  for (BlockArgument arg : block.getArguments())
    if (!arg.getType().isIndex())
      return emitOpError("tile index #")
             << arg.getArgNumber() << " must have type 'index', found "
             << arg.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// BufferOp
//===----------------------------------------------------------------------===//

LogicalResult BufferOp::verify() {
  MemRefType type = getType();
  if (!type.getLayout().isIdentity())
    return emitOpError("result type ")
           << type << " must have the identity layout: the buffer table "
           << "describes contiguous row-major buffers";
  if (type.getMemorySpace())
    return emitOpError("result type ")
           << type << " must be in the default memory space";
  return success();
}

//===----------------------------------------------------------------------===//
// LaneReduceOp / ScratchOp
//===----------------------------------------------------------------------===//

LogicalResult LaneReduceOp::verify() {
  if (getKind() != "add" && getKind() != "maxnumf")
    return emitOpError("kind must be 'add' or 'maxnumf', found '")
           << getKind() << "'";
  int64_t group = getGroup();
  if (group < 1 || group > 32 || (group & (group - 1)) != 0)
    return emitOpError("group must be a power of two from 1 to 32 (lanes of "
                       "one warp on CUDA), found ")
           << group;
  int64_t stride = getStride();
  if (stride < 1 || (stride & (stride - 1)) != 0 || group * stride > 32)
    return emitOpError("stride must be a power of two with group * stride <= "
                       "32 (one warp on CUDA), found stride ")
           << stride << " with group " << group;
  return success();
}

LogicalResult ScratchOp::verify() {
  MemRefType type = getType();
  if (!type.getLayout().isIdentity() || type.getMemorySpace())
    return emitOpError("result type ")
           << type << " must have the identity layout and the default memory "
           << "space; the target places the buffer";
  return success();
}

//===----------------------------------------------------------------------===//
// WaitOp / NotifyOp
//===----------------------------------------------------------------------===//

/// Checks that `indices` address one element of `event`.
static LogicalResult verifyElementAccess(Operation *op, Value event,
                                         ValueRange indices) {
  auto type = cast<EventTensorType>(event.getType());
  if (static_cast<int64_t>(indices.size()) != type.getRank())
    return op->emitOpError("expects ")
           << type.getRank() << " indices for " << type << ", found "
           << indices.size();
  return success();
}

LogicalResult WaitOp::verify() {
  if (getSite().size() == 1)
    return emitOpError("expects a site of a task, an event and the tile's "
                       "coordinates, found 1 value");
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult TraceBeginOp::verify() {
  if (static_cast<int64_t>(getTile().size()) > run::kMaxRecordRank)
    return emitOpError("records at most ")
           << run::kMaxRecordRank << " tile coordinates, found "
           << getTile().size();
  return success();
}

LogicalResult PrefetchOp::verify() {
  int64_t rank = getBuffer().getType().getRank();
  if (static_cast<int64_t>(getOffsets().size()) != rank ||
      static_cast<int64_t>(getSizes().size()) != rank)
    return emitOpError("expects one offset and one size per dimension of the ")
           << rank << "-d buffer, found " << getOffsets().size()
           << " offsets and " << getSizes().size() << " sizes";
  return success();
}

/// Rejects a local notify of a symmetric event tensor: all updates of its
/// counters go through the transport, the own rank's included.
static LogicalResult verifyLocalEvent(Operation *op, Value event) {
  auto type = cast<EventTensorType>(event.getType());
  if (!type.getSymmetric())
    return success();
  return op->emitOpError("notifies the symmetric event tensor ")
         << type << "; use 'event.remote_notify' with the target rank";
}

LogicalResult NotifyOp::verify() {
  if (failed(verifyLocalEvent(*this, getEvent())))
    return failure();
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult NotifyReadyOp::verify() {
  if (failed(verifyLocalEvent(*this, getEvent())))
    return failure();
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult RemoteNotifyOp::verify() {
  auto type = cast<EventTensorType>(getEvent().getType());
  if (!type.getSymmetric())
    return emitOpError("expects a symmetric event tensor (one copy per "
                       "rank), found ")
           << type;
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult PutOp::verify() {
  MemRefType source = getSource().getType(), dest = getDest().getType();
  if (source.getElementType() != dest.getElementType())
    return emitOpError("copies ")
           << source.getElementType() << " elements into a buffer of "
           << dest.getElementType();
  int64_t rank = source.getRank();
  if (static_cast<int64_t>(getSourceOffsets().size()) != rank ||
      static_cast<int64_t>(getSizes().size()) != rank)
    return emitOpError("expects one source offset and one size per "
                       "dimension of the ")
           << rank << "-d source, found " << getSourceOffsets().size()
           << " offsets and " << getSizes().size() << " sizes";
  if (dest.getRank() < rank)
    return emitOpError("puts a ")
           << rank << "-d box into a " << dest.getRank()
           << "-d buffer; the destination needs at least as many dimensions";
  if (static_cast<int64_t>(getDestOffsets().size()) != dest.getRank())
    return emitOpError("expects one destination offset per dimension of the ")
           << dest.getRank() << "-d destination, found "
           << getDestOffsets().size();
  for (MemRefType type : {source, dest})
    if (!type.getLayout().isIdentity() || type.getMemorySpace())
      return emitOpError("expects contiguous row-major buffers in the "
                         "default memory space, found ")
             << type;
  return success();
}

//===----------------------------------------------------------------------===//
// QueuePushOp / QueuePopOp
//===----------------------------------------------------------------------===//

/// Checks that a constant queue capacity fits the 32-bit slots, which hold
/// task ids plus one, and is at least `minimum`.
static LogicalResult verifyQueueCapacity(Operation *op, Value capacity,
                                         int64_t minimum) {
  APInt value;
  if (!matchPattern(capacity, m_ConstantInt(&value)))
    return success();
  int64_t slots = value.getSExtValue();
  if (slots < minimum || slots >= std::numeric_limits<int32_t>::max())
    return op->emitOpError("expects a capacity in [")
           << minimum
           << ", 2147483647) so that task ids fit the 32-bit slots"
           << (minimum > 0 ? " and a push can succeed" : "") << ", found "
           << slots;
  return success();
}

LogicalResult QueuePushOp::verify() {
  // A push into a queue of capacity 0 always overflows.
  return verifyQueueCapacity(*this, getCapacity(), /*minimum=*/1);
}

LogicalResult QueuePopOp::verify() {
  // Capacity 0 is the queue of a program without tiles: the pop returns 0
  // at once, and the worker loop ends.
  return verifyQueueCapacity(*this, getCapacity(), /*minimum=*/0);
}

LogicalResult QueueTryPopOp::verify() {
  return verifyQueueCapacity(*this, getCapacity(), /*minimum=*/0);
}

LogicalResult TestOp::verify() {
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult IdleOp::verify() {
  if (!getEvent()) {
    if (!getIndices().empty() || !getSite().empty())
      return emitOpError("names an element and a site only with 'on' an "
                         "event tensor");
    return success();
  }
  if (getSite().size() < 2)
    return emitOpError("expects a site of a task, an event and the tile's "
                       "coordinates, found ")
           << getSite().size() << " values";
  if (static_cast<int64_t>(getSite().size()) - 2 > run::kMaxRecordRank)
    return emitOpError("records at most ")
           << run::kMaxRecordRank << " tile coordinates, found "
           << getSite().size() - 2;
  return verifyElementAccess(*this, getEvent(), getIndices());
}

LogicalResult StallOp::verify() {
  if (getRole() != "full" && getRole() != "empty")
    return emitOpError("expects the role \"full\" or \"empty\", found \"")
           << getRole() << "\"";
  if (!getCounters()) {
    if (!getSite().empty())
      return emitOpError("names a site only 'on' a counter buffer");
    return success();
  }
  if (getSite().empty())
    return emitOpError("expects a site of a task and the tile's "
                       "coordinates, found none");
  if (static_cast<int64_t>(getSite().size()) - 1 > run::kMaxRecordRank)
    return emitOpError("records at most ")
           << run::kMaxRecordRank << " tile coordinates, found "
           << getSite().size() - 1;
  return success();
}

#define GET_OP_CLASSES
#include "Event/IR/EventOps.cpp.inc"
