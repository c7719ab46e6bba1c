"""Mutants of the lit corpus for fuzzing etc-opt (used by test_fuzz.py).

Each lit input is split at `// -----` into cases; a mutant is one case with
one to three small edits of the kinds a user makes by mistake: a number
replaced by an edge value, an affine operator or a tile index swapped, a
type, keyword or SSA value exchanged for another, a line deleted,
duplicated or swapped. Everything is drawn from one `random.Random(seed)`,
so a seed names the same mutants on every machine.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Values that sit on some boundary: zero, negative, 32- and 64-bit limits.
EDGE_NUMBERS = ("0", "1", "-1", "2", "3", "64", "-7", "2147483647", "2147483648",
                "4294967296", "9223372036854775807", "-9223372036854775808")
AFFINE_OPERATORS = ("mod", "floordiv", "ceildiv", "*", "+", "-")
TYPES = ("f32", "f16", "bf16", "i32", "i64", "index", "i1")
KEYWORDS = (("waits", "notifies"), ("reads", "writes"), ("acquire", "monotonic"),
            ("event.notify ", "event.wait "), ("count(", "("), ("indirect [0]", "indirect [-1]"))

_NUMBER = re.compile(r"(?<![\w%#@^.\-])\d+")
_AFFINE_OPERATOR = re.compile(r"(?<=\s)(mod|floordiv|ceildiv|\*|\+|-)(?=\s)")
_TILE_INDEX = re.compile(r"\bd(\d)\b")
# Not the element type of a dense array: `array<index: ...>` crashes the
# upstream attribute parser (an MLIR bug outside ETC).
_TYPE = re.compile(r"(?<!array<)\b(f32|f16|bf16|i32|i64|index|i1)\b")
_VALUE = re.compile(r"%[A-Za-z_][\w]*|%\d+")
_DIRECTIVE = re.compile(r"^\s*//\s*(RUN|CHECK|[A-Z]+(-[A-Z]+)*:|expected-)")


def corpus() -> list[str]:
    """Every case of every lit input under test/, without FileCheck and
    diagnostic-verification comments."""
    cases = []
    for path in sorted((ROOT / "test").rglob("*.mlir")):
        for case in path.read_text().split("// -----"):
            lines = [line for line in case.splitlines() if not _DIRECTIVE.match(line)]
            text = "\n".join(lines).strip()
            if text:
                cases.append(text + "\n")
    return cases


def _replace_match(rng: random.Random, text: str, pattern: re.Pattern, choices) -> str:
    matches = list(pattern.finditer(text))
    if not matches:
        return text
    m = rng.choice(matches)
    current = m.group(0)
    options = [c for c in choices if c != current] or list(choices)
    return text[:m.start()] + rng.choice(options) + text[m.end():]


def _mutate_lines(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    if len(lines) < 2:
        return text
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    how = rng.choice(("delete", "duplicate", "swap"))
    if how == "delete":
        del lines[i]
    elif how == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines) + "\n"


def _mutate_keyword(rng: random.Random, text: str) -> str:
    present = [(a, b) for a, b in KEYWORDS if a in text or b in text]
    if not present:
        return text
    a, b = rng.choice(present)
    old, new = (a, b) if a in text else (b, a)
    positions = [m.start() for m in re.finditer(re.escape(old), text)]
    at = rng.choice(positions)
    return text[:at] + new + text[at + len(old):]


def _mutate_value(rng: random.Random, text: str) -> str:
    """Replaces a use of an SSA value by another one that appears on an
    earlier line: a forward or self reference in a nested region sends the
    upstream affine verifier into endless recursion (an MLIR bug), and is
    not a mistake this fuzzing is after."""
    uses = list(_VALUE.finditer(text))
    first: dict[str, int] = {}
    for m in uses:
        first.setdefault(m.group(0), m.start())
    m = rng.choice(uses) if uses else None
    if m is None:
        return text
    line_start = text.rfind("\n", 0, m.start()) + 1
    earlier = sorted(n for n, at in first.items() if at < line_start and n != m.group(0))
    if not earlier:
        return text
    return text[:m.start()] + rng.choice(earlier) + text[m.end():]


def _mutate_tile_index(rng: random.Random, text: str) -> str:
    matches = list(_TILE_INDEX.finditer(text))
    if not matches:
        return text
    m = rng.choice(matches)
    return text[:m.start()] + f"d{rng.choice((0, 1, 2, 3))}" + text[m.end():]


MUTATIONS = (
    lambda rng, text: _replace_match(rng, text, _NUMBER, EDGE_NUMBERS),
    lambda rng, text: _replace_match(rng, text, _AFFINE_OPERATOR, AFFINE_OPERATORS),
    lambda rng, text: _replace_match(rng, text, _TYPE, TYPES),
    _mutate_tile_index,
    _mutate_lines,
    _mutate_keyword,
    _mutate_value,
)


def mutants(seed: int, count: int) -> list[str]:
    """`count` distinct mutants of the corpus, the same for the same seed."""
    rng = random.Random(seed)
    cases = corpus()
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        text = rng.choice(cases)
        for _ in range(rng.choice((1, 1, 2, 3))):
            text = rng.choice(MUTATIONS)(rng, text)
        if text not in seen and text not in cases:
            seen.add(text)
            out.append(text)
    return out
