//===- EventTypes.cpp - Types and attributes of the event dialect ---------===//

#include "Event/IR/EventTypes.h"
#include "Event/IR/EventDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace etc::event;

#define GET_TYPEDEF_CLASSES
#include "Event/IR/EventTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "Event/IR/EventAttrs.cpp.inc"

void EventDialect::registerTypesAndAttributes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "Event/IR/EventTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "Event/IR/EventAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Shared syntax
//===----------------------------------------------------------------------===//

/// Parses `[4, ?, 8]`, `?` standing for ShapedType::kDynamic.
static ParseResult parseSizeList(AsmParser &parser,
                                 SmallVectorImpl<int64_t> &sizes) {
  return parser.parseCommaSeparatedList(
      AsmParser::Delimiter::Square, [&]() -> ParseResult {
        if (succeeded(parser.parseOptionalQuestion())) {
          sizes.push_back(ShapedType::kDynamic);
          return success();
        }
        int64_t size;
        if (parser.parseInteger(size))
          return failure();
        sizes.push_back(size);
        return success();
      });
}

static void printSizeList(AsmPrinter &printer, ArrayRef<int64_t> sizes) {
  printer << '[';
  llvm::interleaveComma(sizes, printer, [&](int64_t size) {
    if (ShapedType::isDynamic(size))
      printer << '?';
    else
      printer << size;
  });
  printer << ']';
}

//===----------------------------------------------------------------------===//
// EventTensorType
//===----------------------------------------------------------------------===//

Type EventTensorType::parse(AsmParser &parser) {
  SmallVector<int64_t> shape;
  bool symmetric = false;
  if (parser.parseLess())
    return {};
  if (succeeded(parser.parseOptionalKeyword("symmetric"))) {
    symmetric = true;
  } else if (failed(parser.parseOptionalGreater())) {
    if (parser.parseDimensionList(shape, /*allowDynamic=*/true,
                                  /*withTrailingX=*/false))
      return {};
    if (succeeded(parser.parseOptionalComma())) {
      if (parser.parseKeyword("symmetric"))
        return {};
      symmetric = true;
    }
  } else {
    return parser.getChecked<EventTensorType>(parser.getContext(), shape,
                                              symmetric);
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<EventTensorType>(parser.getContext(), shape,
                                            symmetric);
}

void EventTensorType::print(AsmPrinter &printer) const {
  printer << '<';
  printer.printDimensionList(getShape());
  if (getSymmetric())
    printer << (getShape().empty() ? "symmetric" : ", symmetric");
  printer << '>';
}

unsigned EventTensorType::getNumDynamicDims() const {
  return llvm::count_if(getShape(), ShapedType::isDynamic);
}

std::optional<int64_t> EventTensorType::getNumElements() const {
  int64_t count = 1;
  for (int64_t size : getShape()) {
    if (ShapedType::isDynamic(size))
      return std::nullopt;
    count *= size;
  }
  return count;
}

//===----------------------------------------------------------------------===//
// Divisors
//===----------------------------------------------------------------------===//

AffineExpr etc::event::findNonPositiveDivisor(AffineMap map) {
  AffineExpr found;
  for (AffineExpr result : map.getResults()) {
    result.walk([&](AffineExpr expr) {
      auto binary = dyn_cast<AffineBinaryOpExpr>(expr);
      if (found || !binary || binary.getKind() == AffineExprKind::Add ||
          binary.getKind() == AffineExprKind::Mul)
        return;
      auto divisor = dyn_cast<AffineConstantExpr>(binary.getRHS());
      if (!divisor || divisor.getValue() <= 0)
        found = expr;
    });
    if (found)
      return found;
  }
  return {};
}

/// Emits "<what> divides by <divisor> in '<expr>'" for the first divisor of
/// `map` that is not a positive constant.
static LogicalResult verifyDivisors(function_ref<InFlightDiagnostic()> emitError,
                                    AffineMap map, StringRef what) {
  AffineExpr bad = findNonPositiveDivisor(map);
  if (!bad)
    return success();
  std::string divisor, expr;
  llvm::raw_string_ostream(divisor) << cast<AffineBinaryOpExpr>(bad).getRHS();
  llvm::raw_string_ostream(expr) << bad;
  return emitError() << what << " divides by '" << divisor << "' in '" << expr
                     << "'; mod, floordiv and ceildiv need a positive "
                        "constant divisor";
}

//===----------------------------------------------------------------------===//
// FootprintAttr
//===----------------------------------------------------------------------===//

Attribute FootprintAttr::parseBody(AsmParser &parser, bool verify) {
  AffineMap offsets;
  SmallVector<int64_t> sizes;
  if (parser.parseAffineMap(offsets) || parseSizeList(parser, sizes))
    return {};
  if (!verify)
    return FootprintAttr::get(parser.getContext(), offsets, sizes);
  return parser.getChecked<FootprintAttr>(parser.getContext(), offsets, sizes);
}

/// `<` body `>` for the attributes whose body also appears bare inside
/// op syntax (`parseBody` / `printBody`).
template <typename AttrT>
static Attribute parseAngled(AsmParser &parser) {
  if (parser.parseLess())
    return {};
  Attribute attr = AttrT::parseBody(parser);
  if (!attr || parser.parseGreater())
    return {};
  return attr;
}

template <typename AttrT>
static void printAngled(AsmPrinter &printer, AttrT attr) {
  printer << '<';
  attr.printBody(printer);
  printer << '>';
}

void FootprintAttr::printBody(AsmPrinter &printer) const {
  getOffsets().print(printer.getStream());
  printer << ' ';
  printSizeList(printer, getSizes());
}

Attribute FootprintAttr::parse(AsmParser &parser, Type) {
  return parseAngled<FootprintAttr>(parser);
}

void FootprintAttr::print(AsmPrinter &printer) const { printAngled(printer, *this); }

LogicalResult
FootprintAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      AffineMap offsets, ArrayRef<int64_t> sizes) {
  if (offsets.getNumSymbols() != 0)
    return emitError() << "footprint offsets must not use symbols, found "
                       << offsets.getNumSymbols();
  if (offsets.getNumResults() != sizes.size())
    return emitError() << "footprint has " << offsets.getNumResults()
                       << " offsets but " << sizes.size() << " sizes";
  for (auto [dim, size] : llvm::enumerate(sizes)) {
    if (ShapedType::isDynamic(size)) {
      auto offset = dyn_cast<AffineConstantExpr>(offsets.getResult(dim));
      if (!offset || offset.getValue() != 0)
        return emitError() << "footprint dimension " << dim
                           << " covers the whole buffer ('?') so its offset "
                              "must be 0";
      continue;
    }
    if (size <= 0)
      return emitError() << "footprint size of dimension " << dim
                         << " must be positive or '?', found " << size;
  }
  return verifyDivisors(emitError, offsets, "footprint offset map");
}

//===----------------------------------------------------------------------===//
// IndexMapAttr
//===----------------------------------------------------------------------===//

/// Parses the optional `indirect [k, -1, ...]` suffix of an index map.
static ParseResult parseIndirectList(AsmParser &parser,
                                     SmallVectorImpl<int64_t> &indirect) {
  if (failed(parser.parseOptionalKeyword("indirect")))
    return success();
  return parser.parseCommaSeparatedList(
      AsmParser::Delimiter::Square, [&]() -> ParseResult {
        int64_t buffer;
        if (parser.parseInteger(buffer))
          return failure();
        indirect.push_back(buffer);
        return success();
      });
}

static void printIndirectList(AsmPrinter &printer, ArrayRef<int64_t> indirect) {
  if (indirect.empty())
    return;
  printer << " indirect [";
  llvm::interleaveComma(indirect, printer);
  printer << ']';
}

Attribute IndexMapAttr::parseBody(AsmParser &parser, bool verify) {
  AffineMap map;
  SmallVector<int64_t> indirect;
  if (parser.parseAffineMap(map) || parseIndirectList(parser, indirect))
    return {};
  if (!verify)
    return IndexMapAttr::get(parser.getContext(), map, indirect);
  return parser.getChecked<IndexMapAttr>(parser.getContext(), map, indirect);
}

void IndexMapAttr::printBody(AsmPrinter &printer) const {
  getMap().print(printer.getStream());
  printIndirectList(printer, getIndirect());
}

Attribute IndexMapAttr::parse(AsmParser &parser, Type) {
  return parseAngled<IndexMapAttr>(parser);
}

void IndexMapAttr::print(AsmPrinter &printer) const { printAngled(printer, *this); }

LogicalResult IndexMapAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   AffineMap map, ArrayRef<int64_t> indirect) {
  if (map.getNumSymbols() > 1)
    return emitError() << "event index map may use one symbol (s0, the rank "
                          "the task runs on), found "
                       << map.getNumSymbols();
  if (!indirect.empty() && indirect.size() != map.getNumResults())
    return emitError() << "event index map has " << map.getNumResults()
                       << " results but " << indirect.size()
                       << " indirect entries";
  for (auto [result, buffer] : llvm::enumerate(indirect))
    if (buffer < -1)
      return emitError() << "indirect entry of result " << result
                         << " must be an index buffer number or -1, found "
                         << buffer;
  return verifyDivisors(emitError, map, "event index map");
}

bool IndexMapAttr::hasIndirect() const {
  return llvm::any_of(getIndirect(), [](int64_t buffer) { return buffer >= 0; });
}

//===----------------------------------------------------------------------===//
// LiveAttr
//===----------------------------------------------------------------------===//

Attribute LiveAttr::parseBody(AsmParser &parser, bool verify) {
  // `dN`: a bare identifier, so that the bounded index reads like a map's.
  SMLoc dimLoc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword))
    return {};
  unsigned dim;
  if (!keyword.consume_front("d") || keyword.empty() ||
      keyword.getAsInteger(10, dim)) {
    parser.emitError(dimLoc, "expected the bounded tile index as 'd<N>'");
    return {};
  }
  AffineMap bound;
  if (parser.parseKeyword("below") || parser.parseAffineMap(bound) ||
      parser.parseKeyword("of"))
    return {};
  auto position = dyn_cast_if_present<IndexMapAttr>(
      IndexMapAttr::parseBody(parser, /*verify=*/false));
  if (!position)
    return {};
  if (!verify)
    return LiveAttr::get(parser.getContext(), dim, bound, position);
  return parser.getChecked<LiveAttr>(parser.getContext(), dim, bound,
                                     position);
}

void LiveAttr::printBody(AsmPrinter &printer) const {
  printer << 'd' << getDim() << " below ";
  getBound().print(printer.getStream());
  printer << " of ";
  getPosition().printBody(printer);
}

Attribute LiveAttr::parse(AsmParser &parser, Type) {
  return parseAngled<LiveAttr>(parser);
}

void LiveAttr::print(AsmPrinter &printer) const { printAngled(printer, *this); }

LogicalResult LiveAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               unsigned dim, AffineMap bound,
                               IndexMapAttr position) {
  if (bound.getNumDims() != 1 || bound.getNumSymbols() != 0 ||
      bound.getNumResults() != 1) {
    std::string text;
    llvm::raw_string_ostream(text) << bound;
    return emitError() << "live bound map must take the loaded value as its "
                          "one dimension and give one result, found "
                       << text;
  }
  if (failed(verifyDivisors(emitError, bound, "live bound map")))
    return failure();
  if (failed(IndexMapAttr::verify(emitError, position.getMap(),
                                  position.getIndirect())))
    return failure();
  if (position.getMap().getNumResults() != 1 || !position.isIndirect(0))
    return emitError() << "live bound position map must load one value from "
                          "an index buffer ('indirect [k]' on its one result)";
  return success();
}
