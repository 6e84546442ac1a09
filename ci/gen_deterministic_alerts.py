"""Generate the emulator's table of XPU determinism alerts from a torch-xpu-ops checkout.

Under ``torch.use_deterministic_algorithms(True)`` Intel's XPU kernels call
``at::globalContext().alertNotDeterministic("...")``; the emulator runs every operator as its CPU kernel, which does
not. This script finds every such call under torch-xpu-ops' ``src/ATen/native/xpu/`` and writes
``lightning_xpu/emulator/csrc/deterministic_alerts.inc``: for each operator whose XPU kernel reaches one, the exact
message and the conditions under which it is raised, which ``csrc/deterministic.cpp`` evaluates on the boxed
arguments.

    python ci/gen_deterministic_alerts.py PATH [--ref REF] [--output FILE | --check FILE]

PATH is a torch-xpu-ops work tree, or with ``--ref`` any git directory of it (a bare mirror too), read at REF.
``--check`` fails (exit 1) when FILE is not what the script would write; exit 2 on bad input.

How an alert is mapped to operators, mechanically:

1. the C++ sources are cut into functions (comments, strings and preprocessor lines masked, braces matched);
2. from the function that alerts, its callers are followed up to functions registered for the XPU key: the
   ``XPU:`` dispatch entries of ``yaml/native/native_functions.yaml`` (a structured entry's ``TORCH_IMPL_FUNC``
   also serves each ``structured_delegate`` of it), and ``m.impl("ns::op", TORCH_FN(fn))`` registrations;
3. every ``if``/``else``/``switch`` around the alert and around each call on the way there, and every early
   ``return`` before them, is a condition, rewritten through the call arguments into the registered function's
   parameters, hence the operator's arguments. It must be of a kind the C++ side evaluates (below).

Anything else leaves the path out of the table and in the "not modelled" list (printed, and in the generated
file's header) with the reason: a condition of another kind, a loop, an alert reached through a dispatch stub or
a function pointer (its callers, and their conditions, are PyTorch core's), a message that is not a string literal.
Every alert is accounted for: in the table, or in that list. One operator may have several rows (several paths,
each with its conditions); it alerts once for each row whose conditions all hold.

Condition kinds, each possibly negated: ARG_TRUE (a bool argument), ARG_PRESENT (an optional argument is given),
ARG_INT_EQ (an int argument equals a constant of CONSTANTS), ARG_STR_EQ (a string argument equals a literal),
ARG_FLOATING (a tensor argument has a floating dtype), ARG_EMPTY (a tensor argument has no elements).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "lightning_xpu" / "emulator" / "csrc" / "deterministic_alerts.inc"
SOURCES = "src/ATen/native/xpu/"
YAML = "yaml/native/native_functions.yaml"
MAX_CONDITIONS = 3  # per row; deterministic.cpp's Alert holds this many

# Named integer constants that conditions compare arguments with (ATen's Reduction.h and EmbeddingBag.h).
CONSTANTS = {
    "at::Reduction::None": 0, "Reduction::None": 0, "at::Reduction::Mean": 1, "Reduction::Mean": 1,
    "at::Reduction::Sum": 2, "Reduction::Sum": 2, "MODE_SUM": 0, "MODE_MEAN": 1, "MODE_MAX": 2,
}

# Where the mechanical mapping cannot see an alert: operators whose XPU kernel is a PyTorch core function (not in
# torch-xpu-ops) that calls an alerting operator internally. The emulator runs such an operator as its CPU kernel,
# whose inner calls then run on CPU tensors without reaching the fallback, so the caller gets the callee's rows.
# caller -> (callee, {bool argument: the value the call needs}).
CORE_CALLERS: dict[str, tuple[str, dict[str, bool]]] = {
    # at::native::_embedding_bag_backward_symint (aten/src/ATen/native/EmbeddingBag.cpp) returns
    # at::_embedding_bag_sparse_backward when `sparse`, else at::_embedding_bag_dense_backward with the same mode.
    "aten::_embedding_bag_backward": ("aten::_embedding_bag_dense_backward", {"sparse": False}),
}

_IDENT = r"[A-Za-z_]\w*"
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "decltype", "static_assert", "alignof"}
_LAMBDA = r"\[[&=\w\s,]*\]\s*(\([^()]*\))?\s*(mutable\s*)?(->\s*[\w:<>]+\s*)?"
_CASE = r"\bcase\s+\w+(?:::\w+)*\s*:|\bdefault\s*:"


class Unmodelled(Exception):  # noqa: N818  (an outcome, not a failure of the script)
    """An alert, or a path to one, that the table cannot express; the message says why."""


# ---------------------------------------------------------------- reading the checkout


class Checkout:
    """The files of a torch-xpu-ops tree: a directory, or a git directory at a ref."""

    def __init__(self, path: Path, ref: str | None) -> None:
        self.path, self.ref = path, ref
        if ref is None:
            self.commit = self._git("rev-parse", "HEAD", check=False) or "unknown (not a git checkout)"
            self.label = self._git("rev-parse", "--abbrev-ref", "HEAD", check=False) or "a work tree"
        else:
            self.commit = self._git("rev-parse", f"{ref}^{{commit}}")
            self.label = ref

    def _git(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if check:
                raise SystemExit(f"error: git {' '.join(args)} in {self.path}: {proc.stderr.strip()}")
            return ""
        return proc.stdout.strip()

    def files(self, prefix: str) -> list[str]:
        if self.ref is None:
            root = self.path / prefix
            found = [root] if root.is_file() else root.rglob("*")
            return sorted(p.relative_to(self.path).as_posix() for p in found if p.is_file())
        return sorted(self._git("ls-tree", "-r", "--name-only", self.ref, "--", prefix).splitlines())

    def read(self, name: str) -> str:
        if self.ref is None:
            return (self.path / name).read_text(encoding="utf-8", errors="replace")
        return self._git("show", f"{self.ref}:{name}")


# ---------------------------------------------------------------- C++ structure


def mask(text: str) -> tuple[str, str]:
    """(code, masked): ``text`` with comments blanked; ``masked`` also blanks literals' contents and preprocessor
    lines. Both keep every offset and newline of ``text``."""
    code, masked = list(text), list(text)
    i, n, line_start = 0, len(text), True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            for k in range(i, j):
                if text[k] != "\n":
                    masked[k] = " "
            i = j
            continue
        if c == "\n" or not c.isspace():
            line_start = c == "\n"
        if text.startswith("//", i) or text.startswith("/*", i):
            j = text.find("\n", i) if text[i + 1] == "/" else text.find("*/", i + 2) + 2
            j = n if j < 2 else j
            for k in range(i, j):
                if text[k] != "\n":
                    code[k] = masked[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                masked[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(code), "".join(masked)


def matching(masked: str, i: int) -> int:
    """The index just past the bracket that closes the one at ``i``."""
    opener = masked[i]
    closer, depth = {"{": "}", "(": ")", "[": "]"}[opener], 0
    for j in range(i, len(masked)):
        if masked[j] == opener:
            depth += 1
        elif masked[j] == closer:
            depth -= 1
            if depth == 0:
                return j + 1
    raise Unmodelled(f"unbalanced {opener!r}")


def opening(masked: str, close: int) -> int:
    """The index of the "{" that the "}" at ``close`` closes."""
    depth = 0
    for j in range(close, -1, -1):
        depth += {"}": 1, "{": -1}.get(masked[j], 0)
        if depth == 0:
            return j
    raise Unmodelled("unbalanced '}'")


def split_top(text: str) -> list[str]:
    """``text`` split at its top-level commas (outside (), [], {} and <>)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def statement_start(masked: str, i: int, floor: int) -> int:
    """Where the statement or block header that ends at ``i`` begins (after the last ``;``, ``{`` or ``}``)."""
    j = i - 1
    while j >= floor and masked[j] not in ";{}":
        j -= 1
    return j + 1


@dataclass
class Function:
    name: str
    file: str
    params: list[tuple[str, str]]  # (C++ type, name), in order
    body: tuple[int, int]  # offsets of its "{" and just past its "}"
    code: str = field(repr=False)
    masked: str = field(repr=False)

    @property
    def param_names(self) -> list[str]:
        return [n for _, n in self.params]

    def where(self, pos: int) -> str:
        return f"{self.file}:{self.code.count(chr(10), 0, pos) + 1}"


def _params(text: str) -> list[tuple[str, str]]:
    out = []
    for p in split_top(text):
        m = re.fullmatch(rf"(.*?)\s*\b({_IDENT})\s*(\[[^\]]*\])?", p.split("=")[0].strip(), re.S)
        if m and m.group(1):
            out.append((" ".join(m.group(1).split()), m.group(2)))
    return out


def parse_functions(file: str, text: str) -> tuple[list[Function], list[str]]:
    """The functions defined in ``text`` at namespace scope, and its other top-level statements (masked)."""
    code, masked = mask(text)
    functions: list[Function] = []
    statements: list[str] = []

    def scan(start: int, end: int) -> None:
        i = start
        while i < end:
            k = i
            while True:
                j, semi = masked.find("{", k, end), masked.find(";", k, end)
                if semi >= 0 and (j < 0 or semi < j):
                    statements.append(masked[i : semi + 1])
                    i = semi + 1
                    break
                if j < 0:
                    return
                head = masked[i:j]
                close = matching(masked, j)
                if head.count("(") > head.count(")"):  # a brace inside a parameter list (a default argument)
                    k = close
                    continue
                head = head.strip()
                if re.search(r"\bnamespace(\s+[\w:]+)?$|\bextern\s*\"\s*\"$", head):  # after any stray macro
                    scan(j + 1, close - 1)
                elif (fn := _function_header(head)) is not None:
                    functions.append(Function(fn[0], file, fn[1], (j, close), code, masked))
                else:
                    statements.append(masked[i:close])
                i = close + 1 if masked.startswith(";", close) else close
                break

    scan(0, len(masked))
    return functions, statements


def _function_header(head: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(name, parameters) if ``head``, the text before a "{" at namespace scope, defines a function."""
    impl = re.match(rf"TORCH_IMPL_FUNC\s*\(\s*({_IDENT})\s*\)\s*\((.*)\)\s*$", head, re.S)
    if impl:
        return impl.group(1), _params(impl.group(2))
    if head.startswith("template") and "<" in head:
        depth = 0
        for k in range(head.index("<"), len(head)):
            depth += {"<": 1, ">": -1}.get(head[k], 0)
            if depth == 0:
                head = head[k + 1 :].strip()
                break
    if re.match(r"(struct|class|union|enum)\b", head) or "=" in head.split("(")[0]:
        return None
    name = None
    for m in re.finditer(rf"(~?{_IDENT})\s*\(", head):
        if m.group(1) not in _KEYWORDS:
            name = m
            break
    if name is None or name.group(1).startswith("operator"):
        return None
    open_at = head.index("(", name.start())
    close_at = matching(head, open_at)
    if not re.fullmatch(r"(const|noexcept|override|final|->\s*[\w:<>,\s&*]+|\s)*", head[close_at:]):
        return None
    return name.group(1), _params(head[open_at + 1 : close_at - 1])


# ---------------------------------------------------------------- conditions in the code


@dataclass(frozen=True)
class Guard:
    """A C++ condition over a function's parameters, that must hold (or not, ``negated``) for a statement to run."""

    text: str
    where: str
    negated: bool = False


def _blocks(masked: str, lo: int, pos: int) -> list[int]:
    """The "{" of each block around ``pos`` inside the body opening at ``lo``, innermost first."""
    out, depth = [], 0
    for j in range(pos - 1, lo, -1):
        if masked[j] == "}":
            depth += 1
        elif masked[j] == "{":
            if depth == 0:
                out.append(j)
            else:
                depth -= 1
    return out


def _head(fn: Function, brace: int) -> tuple[str, str, int]:
    """(code, masked, start) of the header of the block opening at ``brace``."""
    hs = statement_start(fn.masked, brace, fn.body[0])
    while fn.masked[hs:brace].count(")") > fn.masked[hs:brace].count("(") and hs > fn.body[0] + 1:
        hs = statement_start(fn.masked, hs - 1, fn.body[0])  # a for header: back over its ";"s
    return fn.code[hs:brace].strip(), fn.masked[hs:brace].strip(), hs


def guards(fn: Function, pos: int) -> list[Guard]:
    """The conditions under which the statement at ``pos`` in ``fn``'s body runs."""
    masked, lo = fn.masked, fn.body[0]
    out: list[Guard] = []
    st = statement_start(masked, pos, lo)
    around = _blocks(masked, lo, pos)
    for b in around:
        head, head_m, hs = _head(fn, b)
        if re.search(_LAMBDA + "$", head_m):
            if "AT_DISPATCH" not in head_m:
                raise Unmodelled(f"inside a lambda at {fn.where(b)}")
            continue  # an AT_DISPATCH lambda: runs once, for the dtype
        if not head_m or head_m.endswith(("=", ",", "(")):
            continue  # a plain block, or an initializer
        if re.match(r"switch\b", head_m):
            out.append(_case_guard(fn, head, head_m, b, pos))
        else:
            out.extend(_branch(fn, head, head_m, hs, b))
    # The statement itself: under a braceless if, or a conditional expression.
    stmt, stmt_m = re.sub(_CASE, "", fn.code[st:pos]).strip(), re.sub(_CASE, "", masked[st:pos]).strip()
    if re.match(r"(if|else|for|while|do)\b", stmt_m):
        out.extend(_branch(fn, stmt, stmt_m, st, pos))
    elif re.search(r"\?|&&|\|\|", stmt_m):
        raise Unmodelled(f"in a conditional expression at {fn.where(pos)}")
    out.extend(_exits(fn, lo, st, pos, around))
    return out


def _branch(fn: Function, head: str, head_m: str, hs: int, at: int) -> list[Guard]:
    """The guards of the block or statement whose header is ``head``: an if, else if, else; anything else raises."""
    m = re.match(r"(else\s+)?if\s*\(", head_m)
    if m:
        open_at = head_m.index("(", m.start())
        cond = " ".join(head[open_at + 1 : matching(head_m, open_at) - 1].split())
        own = [Guard(cond, fn.where(at))]
        return own + _previous_branches(fn, hs) if m.group(1) else own
    if re.match(r"else\b", head_m):
        return _previous_branches(fn, hs)
    if re.match(r"(try|catch)\b", head_m):
        return []
    kind = head_m.split("(")[0].split()[0] if head_m.split() else "?"
    if kind in ("for", "while", "do"):
        raise Unmodelled(f"inside a loop at {fn.where(at)}")
    raise Unmodelled(f"inside an unrecognised block `{' '.join(head.split())[:60]}` at {fn.where(at)}")


def _previous_branches(fn: Function, else_at: int) -> list[Guard]:
    """For an ``else`` at ``else_at``: the negated condition of each branch of its if chain before it."""
    masked, lo = fn.masked, fn.body[0]
    j = else_at - 1
    while masked[j].isspace():
        j -= 1
    if masked[j] == "}":
        head, head_m, hs = _head(fn, opening(masked, j))
    else:  # a braceless branch: `if (c) statement;`
        hs = statement_start(masked, j, lo)
        head, head_m = fn.code[hs:j].strip(), masked[hs:j].strip()
        inner = re.match(r"(else\s+)?if\s*\(", head_m)
        if inner:
            close = matching(head_m, head_m.index("("))
            head, head_m = head[:close], head_m[:close]
    m = re.match(r"(else\s+)?if\s*\(", head_m)
    if not m:
        raise Unmodelled(f"an else without its if at {fn.where(else_at)}")
    cond = " ".join(head[head_m.index("(") + 1 : matching(head_m, head_m.index("(")) - 1].split())
    mine = [Guard(cond, fn.where(hs), negated=True)]
    return mine + _previous_branches(fn, hs) if m.group(1) else mine


def _branch_of_chain(fn: Function, brace: int, around: list[int]) -> bool:
    """Whether the block opening at ``brace`` is a branch of an if/else chain of which a later branch is one of the
    blocks ``around`` (so the two never both run)."""
    masked = fn.masked
    while True:
        rest = masked[matching(masked, brace) :]
        m = re.match(r"\s*else\s*(if\s*\()?", rest)
        if not m:
            return False
        k = len(masked) - len(rest) + m.end()
        if m.group(1):
            k = matching(masked, k - 1)
        brace = masked.find("{", k)
        if brace < 0 or masked[k:brace].strip():
            return False  # a braceless branch
        if brace in around:
            return True


def _case_guard(fn: Function, head: str, head_m: str, brace: int, pos: int) -> Guard:
    """The guard of the statement at ``pos`` in the switch whose body opens at ``brace``: its single case label."""
    masked = fn.masked
    open_at = head_m.index("(")
    switched = " ".join(head[open_at + 1 : matching(head_m, open_at) - 1].split())
    labels, depth, k = [], 0, brace + 1  # the labels of this switch (not a nested one) before the statement
    pattern = re.compile(_CASE)
    while k < pos:
        depth += {"{": 1, "}": -1}.get(masked[k], 0)
        m = pattern.match(masked, k) if depth == 0 and not masked[k - 1].isalnum() else None
        if m:
            labels.append((k, m.end(), m.group(0)))
            k = m.end()
        else:
            k += 1
    if not labels:
        raise Unmodelled(f"in a switch before its first case at {fn.where(pos)}")
    group = [labels[-1]]
    for prev in reversed(labels[:-1]):
        if masked[prev[1] : group[0][0]].strip():
            if not re.search(r"\b(break|return|throw)\b", masked[prev[1] : group[0][0]]):
                raise Unmodelled(f"a switch case falls through into the one at {fn.where(pos)}")
            break
        group.insert(0, prev)
    if len(group) != 1 or group[0][2].startswith("default"):
        raise Unmodelled(f"under several case labels, or default, at {fn.where(pos)}")
    label = re.match(r"case\s+(\w+(?:::\w+)*)", group[0][2]).group(1)
    return Guard(f"{switched} == {label}", fn.where(pos))


def _exits(fn: Function, lo: int, st: int, pos: int, around: list[int]) -> list[Guard]:
    """Negated guards for the early exits before the statement at ``st`` (``pos``), whose blocks are ``around``."""
    masked, out = fn.masked, []
    for m in re.finditer(r"\b(return|throw|break|continue|goto)\b", masked[lo:st]):
        at = lo + m.start()
        extra = [b for b in _blocks(masked, lo, at) if b not in around]  # blocks that closed before st
        heads = [_head(fn, b) for b in extra]
        if any(re.search(_LAMBDA + "$", h[1]) for h in heads):
            continue  # it leaves a lambda only
        if m.group(1) in ("break", "continue") and any(re.match(r"(for|while|do|switch)\b", h[1]) for h in heads):
            continue  # it leaves a loop or switch that closed before the statement
        if not extra and re.search(_CASE, masked[at:pos]):
            continue  # it ends another case of the switch the statement is in
        if extra and _branch_of_chain(fn, extra[-1], around):
            continue  # it ends another branch of an if chain the statement is in
        ex_st = statement_start(masked, at, lo)
        if not extra and re.match(r"if\s*\(", masked[ex_st:at].strip()):  # `if (c) return ...;`
            g = _branch(fn, fn.code[ex_st:at].strip(), masked[ex_st:at].strip(), ex_st, at)
        elif len(extra) == 1 and re.match(r"if\s*\(", heads[0][1]) and ex_st == extra[0] + 1:
            g = _branch(fn, heads[0][0], heads[0][1], heads[0][2], at)  # `if (c) { return ...; }`
        else:
            raise Unmodelled(f"after an early exit at {fn.where(at)}")
        if len(g) != 1:
            raise Unmodelled(f"after an early exit in an if chain at {fn.where(at)}")
        out.append(replace(g[0], negated=not g[0].negated))
    return out


# ---------------------------------------------------------------- condition kinds


@dataclass(frozen=True)
class Condition:
    kind: str
    arg: str = ""
    negate: bool = False
    value: int = 0
    text: str = ""

    def render(self) -> str:
        negate = "true" if self.negate else "false"
        return f'{{Cond::{self.kind}, {negate}, "{self.arg}", {self.value}, "{self.text}"}}'

    def describe(self) -> str:
        operand = {"ARG_INT_EQ": f", {self.value}", "ARG_STR_EQ": f', "{self.text}"'}.get(self.kind, "")
        return f"{'not ' if self.negate else ''}{self.kind}({self.arg}{operand})"


ALWAYS: tuple[Condition, ...] = ()


@dataclass
class Schema:
    name: str  # "ns::name"
    overload: str
    args: list[tuple[str, str]]  # (type, name), out arguments included, in order

    @property
    def full(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def types(self) -> dict[str, str]:
        return {n: t for t, n in self.args}


def classify(guard: Guard, schema: Schema, params: dict[str, str]) -> Condition:
    """The condition kind of ``guard``, whose identifiers are parameters of the registered function."""
    types = schema.types

    def arg(ident: str, *allowed: str) -> str:
        if params.get(ident) not in types:
            raise Unmodelled(f"the condition `{guard.text}` at {guard.where} is not on an operator argument")
        name = params[ident]
        if not any(re.fullmatch(p, types[name]) for p in allowed):
            raise Unmodelled(f"the condition `{guard.text}` at {guard.where}: argument {name} is {types[name]}")
        return name

    text, negate = guard.text, guard.negated
    while True:  # peel negations and outer parentheses
        rest = text[1:].strip() if text.startswith("!") and not text.startswith("!=") else text
        if rest.startswith("(") and matching(rest, 0) == len(rest):
            rest = rest[1:-1].strip()
        elif rest is text or not re.fullmatch(r"[\w:]+(\.\w+\(\))?", rest):
            break
        text, negate = rest, negate != text.startswith("!")
    if m := re.fullmatch(r"(\w+)", text):
        return Condition("ARG_TRUE", arg(m.group(1), "bool"), negate)
    if m := re.fullmatch(r"(\w+)\.has_value\(\)", text):
        return Condition("ARG_PRESENT", arg(m.group(1), r".*\?"), negate)
    if m := re.fullmatch(r"(\w+)\.defined\(\)", text):
        return Condition("ARG_PRESENT", arg(m.group(1), r"Tensor\?"), negate)
    if m := re.fullmatch(r"(?:at::)?isFloatingType\((\w+)\.scalar_type\(\)\)|(\w+)\.is_floating_point\(\)", text):
        return Condition("ARG_FLOATING", arg(m.group(1) or m.group(2), r"Tensor\??"), negate)
    if m := re.fullmatch(r"(\w+)\.numel\(\)\s*(==|!=)\s*0", text):
        return Condition("ARG_EMPTY", arg(m.group(1), r"Tensor"), negate != (m.group(2) == "!="))
    if (m := re.fullmatch(r"(\w+)\s*(==|!=)\s*([\w:]+)", text)) and m.group(3) in CONSTANTS:
        name = arg(m.group(1), r"int|SymInt")
        return Condition("ARG_INT_EQ", name, negate != (m.group(2) == "!="), CONSTANTS[m.group(3)])
    if m := re.fullmatch(r'(\w+)\s*(==|!=)\s*"([\w ]*)"', text):
        name = arg(m.group(1), r"str\??")
        return Condition("ARG_STR_EQ", name, negate != (m.group(2) == "!="), text=m.group(3))
    raise Unmodelled(f"the condition `{guard.text}` at {guard.where} is not of a kind the table models")


def simplify(conditions: set[Condition]) -> tuple[Condition, ...] | None:
    """Drop the conditions another implies (x == a implies x != b); None when they contradict each other."""
    kept = set(conditions)
    for c in conditions:
        if c.kind in ("ARG_INT_EQ", "ARG_STR_EQ") and not c.negate:
            for d in conditions:
                if d.kind == c.kind and d.arg == c.arg and d != c:
                    if not d.negate or (d.value, d.text) == (c.value, c.text):
                        return None
                    kept.discard(d)
    if any(replace(c, negate=not c.negate) in kept for c in kept):
        return None
    return tuple(sorted(kept, key=lambda c: (c.arg, c.kind, c.negate, c.value, c.text)))


def substitute(text: str, mapping: dict[str, str]) -> str:
    """``text`` with each whole-word parameter of ``mapping`` replaced by its argument expression."""

    def repl(m: re.Match[str]) -> str:
        value = mapping.get(m.group(0), m.group(0))
        return value if re.fullmatch(r"[\w.:]+(\(\))?", value) else f"({value})"

    return re.sub(rf"(?<![.\w>:]){_IDENT}", repl, text)


# ---------------------------------------------------------------- registrations


def parse_schema(func: str) -> Schema:
    m = re.match(r"(\w+)(?:\.(\w+))?\((.*)\)\s*->", func)
    if not m:
        raise ValueError(f"not a schema: {func}")
    args = []
    for a in split_top(m.group(3)):
        if a != "*":
            t, _, name = a.split("=")[0].strip().rpartition(" ")
            args.append((re.sub(r"\(\w+!?\)", "", t).strip(), name))  # without alias annotations
    return Schema(f"aten::{m.group(1)}", m.group(2) or "", args)


def parse_yaml(text: str) -> dict[str, list[tuple[Schema, Schema]]]:
    """XPU kernel function -> (operator, the schema of the kernel's parameters) for each operator it implements:
    a structured kernel also implements the operators that delegate to its entry."""
    entries: list[dict] = []
    in_dispatch = False
    for line in text.splitlines():
        if line.startswith("- func:"):
            entries.append({"func": line[len("- func:") :].strip(), "dispatch": {}})
            in_dispatch = False
        elif not entries or not line.strip() or line.lstrip().startswith("#"):
            continue
        elif line.startswith("    ") and in_dispatch:
            keys, _, value = line.strip().partition(":")
            for key in keys.split(","):
                entries[-1]["dispatch"][key.strip()] = value.strip()
        elif line.startswith("  "):
            key, _, value = line.strip().partition(":")
            in_dispatch = key == "dispatch"
            if not in_dispatch:
                entries[-1][key] = value.split("#")[0].strip()
    by_name = {}
    for e in entries:
        e["schema"] = parse_schema(e["func"])
        by_name[e["schema"].full.removeprefix("aten::")] = e
    kernels: dict[str, list[tuple[Schema, Schema]]] = {}
    for e in entries:
        source = by_name.get(e["structured_delegate"]) if "structured_delegate" in e else e
        fn = source["dispatch"].get("XPU") if source else None
        if fn:
            kernels.setdefault(fn, []).append((e["schema"], source["schema"]))
    return kernels


def _schema_type(cpp: str) -> str:
    """The schema type of a C++ parameter type, for registrations that have no yaml schema."""
    base = cpp.replace("const", "").replace("&", "").replace("at::", "").replace("c10::", "").strip()
    optional = re.fullmatch(r"(?:std::)?optional<(.*)>", base)
    inner = optional.group(1) if optional else base
    name = {"Tensor": "Tensor", "bool": "bool", "int64_t": "int", "double": "float"}.get(inner.strip(), inner)
    return name + "?" if optional else name


def _param_map(fn: Function, schema: Schema) -> dict[str, str]:
    """The registered function's parameters -> the schema's argument names: by position where they line up."""
    names = [n for _, n in schema.args]
    if len(fn.params) == len(names):
        return dict(zip(fn.param_names, names, strict=True))
    return {p: p for p in fn.param_names if p in names}


# ---------------------------------------------------------------- the analysis


@dataclass
class Row:
    schema: Schema
    message: str
    conditions: tuple[Condition, ...]
    site: str


@dataclass
class Result:
    rows: list[Row]
    unmodelled: list[tuple[str, str]]  # (what, why)


def _message(code: str, open_at: int, close: int) -> str:
    inner = code[open_at + 1 : close - 1].strip()
    literal = r'"(?:[^"\\]|\\.)*"'
    if not re.fullmatch(rf"({literal}\s*)+", inner):
        raise Unmodelled(f"the message `{' '.join(inner.split())}` is not a string literal")
    return "".join(s[1:-1] for s in re.findall(literal, inner))


class Analysis:
    def __init__(self, checkout: Checkout) -> None:
        self.registrations = parse_yaml(checkout.read(YAML))
        self.functions: list[Function] = []
        self.statements: list[tuple[str, str]] = []  # (file, masked text) outside functions
        self.stray: list[str] = []  # alerts outside any function
        for name in checkout.files(SOURCES):
            if not name.endswith((".cpp", ".h", ".hpp", ".template")):
                continue
            fns, stmts = parse_functions(name, checkout.read(name))
            self.functions.extend(fns)
            self.statements.extend((name, s) for s in stmts)
            self.stray.extend(name for s in stmts if "alertNotDeterministic" in s)
        self.by_name: dict[str, list[Function]] = {}
        for f in self.functions:
            self.by_name.setdefault(f.name, []).append(f)
        impl = r'm\.impl\(\s*(?:TORCH_SELECTIVE_NAME\()?\s*"([\w:.]+)"\s*\)?\s*,\s*TORCH_FN\(\s*([\w:]+)\s*\)'
        for f in self.functions:
            for op, target in re.findall(impl, f.code[f.body[0] : f.body[1]]):
                name, _, overload = op.partition(".")
                for t in self.by_name.get(target.split("::")[-1], []):
                    schema = Schema(name, overload, [(_schema_type(ty), n) for ty, n in t.params])
                    self.registrations.setdefault(t.name, []).append((schema, schema))

    def run(self) -> Result:
        rows: list[Row] = []
        unmodelled = [(f"an alert in {file}", "outside any function the script reads") for file in self.stray]
        for fn in self.functions:
            lo, hi = fn.body
            for m in re.finditer(r"\balertNotDeterministic\s*\(", fn.masked[lo:hi]):
                at, open_at = lo + m.start(), lo + m.end() - 1
                site = fn.where(at)
                try:
                    message = _message(fn.code, open_at, matching(fn.masked, open_at))
                    paths = self.reach(fn, guards(fn, at), [fn.name])
                except Unmodelled as e:
                    unmodelled.append((f"{fn.name} ({site})", str(e)))
                    continue
                for schema, gs, params, path in paths:
                    what = f"{schema.full} (via {' -> '.join(reversed(path))}, {site})"
                    try:
                        conds = simplify({classify(g, schema, params) for g in gs})
                        if conds is None:
                            continue  # a path no input takes
                        if len(conds) > MAX_CONDITIONS:
                            raise Unmodelled(f"{len(conds)} conditions, more than {MAX_CONDITIONS}")
                    except Unmodelled as e:
                        unmodelled.append((what, str(e)))
                        continue
                    rows.append(Row(schema, message, conds, site))
        rows += self.core_callers(rows, unmodelled)
        core = {s.full for fn, ss in self.registrations.items() for s, _ in ss if fn not in self.by_name}
        unmodelled.append((f"the {len(core)} operator(s) whose XPU kernel is a PyTorch core function",
                           "the alerts of operators they call inside are not raised (the emulator runs the CPU "
                           "kernel, whose inner calls stay on CPU), except for CORE_CALLERS"))
        return Result(_merge(rows), unmodelled)

    def core_callers(self, rows: list[Row], unmodelled: list[tuple[str, str]]) -> list[Row]:
        """The rows CORE_CALLERS gives: each caller gets its callee's, with the call's own conditions."""
        out = []
        kernels = {s.full: (fn, s) for fn, schemas in self.registrations.items() for s, _ in schemas}
        for caller, (callee, needs) in CORE_CALLERS.items():
            fn, schema = kernels.get(caller, (None, None))
            try:
                if schema is None:
                    raise Unmodelled(f"CORE_CALLERS is stale: {caller} has no XPU kernel in {YAML}")
                if fn in self.by_name:
                    raise Unmodelled(f"CORE_CALLERS is stale: {caller}'s XPU kernel {fn} is in torch-xpu-ops now")
                call = {Condition("ARG_TRUE", arg, negate=not value) for arg, value in needs.items()}
                for r in (r for r in rows if r.schema.full == callee):
                    if any(schema.types.get(c.arg) != r.schema.types[c.arg] for c in r.conditions):
                        raise Unmodelled(f"a condition of {callee} is not on an argument of {caller}")
                    conds = simplify(set(r.conditions) | call)
                    if conds is not None:
                        out.append(Row(schema, r.message, conds, f"{r.site}, through PyTorch core's {fn}"))
            except Unmodelled as e:
                unmodelled.append((caller, str(e)))
        return out

    def reach(self, fn: Function, gs: list[Guard], path: list[str]) -> list[tuple[Schema, list[Guard], dict, list]]:
        """(schema, guards, {parameter: argument}, path) for each registered operator that ``fn`` is reached from."""
        found = [(s, gs, _param_map(fn, k), path) for s, k in self.registrations.get(fn.name, [])]
        pattern = re.compile(rf"(?<![\w.>]){re.escape(fn.name)}\b\s*(<[^;{{}}()]*>)?\s*(\()?")
        for caller in self.functions:
            lo, hi = caller.body
            for m in pattern.finditer(caller.masked, lo, hi):
                if re.search(r"TORCH_FN\(\s*[\w:]*$", caller.masked[lo : m.start()]):
                    continue  # a registration: self.registrations has it
                where = caller.where(m.start())
                if not m.group(2):
                    raise Unmodelled(f"{fn.name} is referenced without being called at {where}")
                if caller.name in path:
                    raise Unmodelled(f"{fn.name} is called recursively at {where}")
                if len({(t.file, len(t.params)) for t in self.by_name[fn.name]}) > 1:
                    raise Unmodelled(f"{fn.name} has several definitions: the call at {where} is ambiguous")
                open_at = m.end() - 1
                args = split_top(caller.code[open_at + 1 : matching(caller.masked, open_at) - 1])
                mapping = dict(zip(fn.param_names, args, strict=False))
                up = [replace(g, text=substitute(g.text, mapping)) for g in gs]
                found += self.reach(caller, up + guards(caller, m.start()), path + [caller.name])
        for file, text in self.statements:
            if "{" in text and re.search(rf"(?<![\w.>]){re.escape(fn.name)}\b", text):
                raise Unmodelled(f"{fn.name} is used inside a class or an initializer ({file})")
            if re.search(rf"(?<![\w.>]){re.escape(fn.name)}\b(?!\s*\()", text):  # not a declaration
                stub = re.search(r"REGISTER_\w*DISPATCH\(\s*(\w+)", text)
                via = f"the dispatch stub {stub.group(1)}" if stub else "a function pointer"
                raise Unmodelled(f"{fn.name} is reached through {via} ({file}), from PyTorch core: its callers "
                                 "and their conditions are not in torch-xpu-ops")
        if not found:
            raise Unmodelled(f"{fn.name} is neither registered for XPU nor called")
        return found


def _merge(rows: list[Row]) -> list[Row]:
    """Rows without duplicates; an operator with an unconditional row keeps only that one."""
    out: list[Row] = []
    for r in rows:
        same = [o for o in out if o.schema.full == r.schema.full]
        if any(o.conditions == ALWAYS for o in same) or any((o.message, o.conditions) == (r.message, r.conditions)
                                                             for o in same):
            continue
        if r.conditions == ALWAYS:
            out = [o for o in out if o.schema.full != r.schema.full]
        out.append(r)
    return sorted(out, key=lambda r: (r.schema.full, r.site))


def analyse(checkout: Checkout) -> Result:
    return Analysis(checkout).run()


# ---------------------------------------------------------------- output


def render(result: Result, checkout: Checkout) -> str:
    lines = [
        "// GENERATED by ci/gen_deterministic_alerts.py: do not edit, run it again.",
        f"// From intel/torch-xpu-ops {checkout.label}, commit {checkout.commit}.",
        "// The alertNotDeterministic() calls of its XPU kernels, by operator: {operator, overload, message,",
        "// condition count, {{kind, negated, argument, int value, string value}, ...}}; a row alerts when all its",
        "// conditions hold. Included by deterministic.cpp.",
        "//",
        "// Not modelled (the emulator does not raise these alerts):",
    ]
    for what, why in result.unmodelled or [("(none)", "")]:
        lines += textwrap.wrap(f"{what}: {why}" if why else what, 116, initial_indent="//   ",
                               subsequent_indent="//       ", break_on_hyphens=False, break_long_words=False)
    lines.append("")
    for r in result.rows:
        conds = ", ".join(c.render() for c in r.conditions)
        lines.append(f"// {r.site}")
        lines.append(f'{{"{r.schema.name}", "{r.schema.overload}", "{r.message}", {len(r.conditions)}, {{{conds}}}}},')
    return "\n".join(lines) + "\n"


def summary(result: Result) -> str:
    out = [f"{len(result.rows)} table rows:"]
    for r in result.rows:
        when = " and ".join(c.describe() for c in r.conditions) or "always"
        out.append(f"  {r.schema.full}: {r.message!r}, {when}")
    out.append(f"not modelled ({len(result.unmodelled)}):")
    out += [f"  {what}: {why}" for what, why in result.unmodelled]
    return "\n".join(out)


def generator_parser(description: str, output: Path) -> argparse.ArgumentParser:
    """The arguments every table generator over a torch-xpu-ops checkout takes: PATH, --ref, --output or --check."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("path", type=Path, help="a torch-xpu-ops work tree, or its git directory with --ref")
    parser.add_argument("--ref", help="read the git directory PATH at this ref (a branch, tag or commit)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--output", type=Path, default=output, help="where to write (default: the emulator's csrc)")
    target.add_argument("--check", type=Path, help="fail when this file is not what would be written")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = generator_parser(__doc__.split("\n\n")[0], OUTPUT).parse_args(argv)
    if not args.path.is_dir():
        print(f"error: {args.path} is not a directory", file=sys.stderr)
        return 2
    checkout = Checkout(args.path, args.ref)
    if not checkout.files(YAML):
        print(f"error: {args.path} has no {YAML}: not a torch-xpu-ops checkout", file=sys.stderr)
        return 2
    result = analyse(checkout)
    text = render(result, checkout)
    print(summary(result))
    return write_or_check(text, args.output, args.check, "ci/gen_deterministic_alerts.py")


def write_or_check(text: str, output: Path, check: Path | None, script: str) -> int:
    """Write the generated ``text`` to ``output``; with ``check``, only compare it with that file (1 if stale)."""
    if check:
        if not check.is_file() or check.read_text() != text:
            print(f"{check} is stale: run {script} again", file=sys.stderr)
            return 1
        return 0
    output.write_text(text)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
