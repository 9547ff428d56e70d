"""Interview follow-up questions: each kata's bank in its manifest, parsed with it (a broken question
fails when the manifest loads), and an answer judged here. The interview draws and asks them.

Two kinds, as ``[[followups]]`` entries of ``kata.toml``::

    [[followups]]
    id = "why-sqrt"                      # unique in the kata; the history records it
    kind = "choice"                      # multiple choice: options are shuffled when asked
    question = "Why divide the scores by sqrt(d_k)?"
    options = ["right answer", "distractor", "distractor"]
    answer = 1                           # 1-based, into options as written
    explain = "Shown after answering, right or wrong."

    [[followups]]
    id = "score-bytes"
    kind = "numeric"                     # parameters drawn per interview, answer computed
    question = "B = {B}, H = {H}, T = {T:,}, fp16: bytes of the (B, H, T, T) scores?"
    params = { B = [1, 2, 4], H = [8, 16], T = [1024, 4096] }
    answer = "B * H * T**2 * 2"          # arithmetic over the params (see FUNCTIONS)
    unit = "bytes"                       # optional
    rel_tol = 0.0                        # optional; 0.01 by default (interview arithmetic)
    explain = "... {answer:,} ..."       # may use the params and {answer}
    mistakes = [{ answer = "B * H * T**2", explain = "That counts elements, not bytes." }]   # explain as above

Answers are never stored for numeric questions: the expression is evaluated for the drawn
parameters by a small evaluator that knows arithmetic and FUNCTIONS and nothing else. The
learner may answer with a number (``4294967296``, ``4_294_967_296``, ``4.29e9``), a unit suffix
(``4 GiB``, ``4.3 GB``, ``12M``), a unit word (``125 keys``) or arithmetic (``2 * 16 * 4096**2``, ``2^32``).
"""
from __future__ import annotations

import ast
import math
import operator
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

FUNCTIONS = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log2": math.log2,
             "ceil": math.ceil, "floor": math.floor, "min": min, "max": max, "isqrt": math.isqrt}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
DEFAULT_REL_TOL = 0.01
# Decimal and binary multipliers an answer may end with ("4 GiB", "1.5M").
_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_MULTIPLIER = re.compile(r"(ki|mi|gi|ti|k|m|g|t)(b|bytes?|flops?|params?)?")


class QuestionError(ValueError):
    """A follow-up entry that does not follow the format; the message says how to fix it."""


def evaluate(expression: str, names: dict | None = None) -> float | int:
    """The value of an arithmetic expression over ``names`` and FUNCTIONS; nothing else runs."""
    names = names or {}
    tree = _tree(expression)

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 256:
                raise ValueError(f"the exponent {right} is too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                and not node.keywords):
            return FUNCTIONS[node.func.id](*(value(a) for a in node.args))
        raise ValueError(f"{ast.unparse(node)!r} is not allowed in {expression!r}: use numbers, "
                         f"{', '.join(sorted(names)) + ', ' if names else ''}+ - * / // % ** and "
                         f"{', '.join(FUNCTIONS)}")

    try:
        return value(tree.body)
    except (ArithmeticError, TypeError) as exc:
        raise ValueError(f"{expression!r} cannot be computed: {exc}") from None


@lru_cache(maxsize=1024)
def _tree(expression: str) -> ast.Expression:
    """The parsed ``expression``, once: a manifest's numeric questions are computed for every
    combination of their parameters as it loads."""
    try:
        return ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None


def parse_answer(text: str) -> float:
    """A learner's numeric answer: a number, a unit suffix or arithmetic; ValueError if none."""
    cleaned = text.strip().lower().replace(",", "").replace("_", "").replace("^", "**")
    # A trailing word is a multiplier ("4 GiB", "12M") or a unit ("bytes", "keys"), never a number.
    cleaned, unit = re.fullmatch(r"(.*?)\s*([a-z]*)", cleaned).groups()
    scaled = _MULTIPLIER.fullmatch(unit)
    multiplier = _SUFFIXES[scaled.group(1)] if scaled else 1
    if not cleaned:
        raise ValueError("no number given")
    result = evaluate(cleaned)
    if isinstance(result, float) and not math.isfinite(result):
        raise ValueError("not a finite number")
    return result * multiplier


def letter(text: str) -> str:
    """A choice answer as typed ("B", "b)", " c ") as its lower-case letter."""
    return text.strip().lower().rstrip(")").strip()


def close(given: float, expected: float, rel_tol: float) -> bool:
    return math.isclose(given, expected, rel_tol=rel_tol, abs_tol=1e-12 if rel_tol else 0.0)


def show(value) -> str:
    """A number as an interviewer says it: exact integers with separators, floats to 4 digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    question: str
    explain: str
    options: tuple[str, ...] = ()
    answer: int | str = 1
    params: dict = field(default_factory=dict)
    unit: str = ""
    rel_tol: float = DEFAULT_REL_TOL
    mistakes: tuple[tuple[str, str], ...] = ()

    def draw(self, rng: random.Random, kata: str) -> Asked:
        """This question as asked in one interview: parameters drawn, options shuffled."""
        if self.kind == "choice":
            order = list(range(len(self.options)))
            rng.shuffle(order)
            return Asked(kata, self, {}, tuple(order))
        values = {name: rng.choice(choices) for name, choices in self.params.items()}
        return Asked(kata, self, values, ())


@dataclass(frozen=True)
class Asked:
    """One question of one interview. Everything here is recorded in the history."""
    kata: str
    question: Question
    params: dict
    order: tuple[int, ...]      # choice: the options' positions as shown

    @property
    def text(self) -> str:
        # A choice question has no parameters: its text is literal, braces included (e^{s − m}).
        q = self.question
        return q.question.format(**self.params) if q.kind == "numeric" else q.question

    @property
    def choices(self) -> list[str]:
        return [self.question.options[i] for i in self.order]

    @property
    def expected(self):
        """The right answer: the letter of the right option, or the computed number."""
        if self.question.kind == "choice":
            return "abcdef"[self.order.index(self.question.answer - 1)]
        return evaluate(self.question.answer, self.params)

    def grade(self, given: str) -> tuple[bool, str]:
        """(right?, what to tell the learner): the verdict, the answer and the explanation."""
        q, expected = self.question, self.expected
        explain = q.explain.format(**self.params, answer=expected) if q.kind == "numeric" else q.explain
        if q.kind == "choice":
            if letter(given) == expected:
                return True, f"Right. {explain}"
            right = self.choices["abcdef".index(expected)].rstrip(".")
            return False, f"The answer is {expected}) {right}. {explain}"
        unit = f" {q.unit}" if q.unit else ""
        try:
            number = parse_answer(given)
        except ValueError:
            return False, f"That is not a number. The answer is {show(expected)}{unit}. {explain}"
        if close(number, expected, q.rel_tol):
            return True, f"Right: {show(expected)}{unit}. {explain}"
        for wrong, why in q.mistakes:
            if close(number, evaluate(wrong, self.params), q.rel_tol):
                why = why.format(**self.params, answer=expected)   # a mistake's explain names the parameters too
                return False, f"{why} The answer is {show(expected)}{unit}. {explain}"
        return False, f"You said {show(number)}; the answer is {show(expected)}{unit}. {explain}"


def _text(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise QuestionError(f"{where}: {key} must be a non-empty string.")
    return value.strip()


def parse(item: dict, where: str) -> Question:
    """One ``[[followups]]`` entry, checked: every numeric question is computed on the spot for
    every combination of its parameters, so a broken expression fails when the manifest loads."""
    kind = item.get("kind")
    common = {"id", "kind", "question", "explain"}
    allowed = common | ({"options", "answer"} if kind == "choice" else {"params", "answer", "unit", "rel_tol", "mistakes"})
    if kind not in ("choice", "numeric"):
        raise QuestionError(f"{where}: kind must be \"choice\" or \"numeric\", not {kind!r}.")
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise QuestionError(f"{where}: unknown key {unknown[0]!r} for a {kind} question. "
                            f"Known keys: {', '.join(sorted(allowed))}.")
    ident = _text(item, "id", where)
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", ident):
        raise QuestionError(f"{where}: id {ident!r} must be lower-case words joined by hyphens.")
    question, explain = _text(item, "question", where), _text(item, "explain", where)
    if kind == "choice":
        options = item.get("options")
        if not (isinstance(options, list) and 2 <= len(options) <= 6
                and all(isinstance(o, str) and o.strip() for o in options) and len(set(options)) == len(options)):
            raise QuestionError(f"{where}: options must list 2 to 6 different non-empty strings.")
        answer = item.get("answer")
        if type(answer) is not int or not 1 <= answer <= len(options):
            raise QuestionError(f"{where}: answer must be the 1-based number of the right option (1 to {len(options)}).")
        return Question(ident, kind, question, explain, options=tuple(o.strip() for o in options), answer=answer)

    params = item.get("params", {})
    if not isinstance(params, dict) or not all(
            isinstance(v, list) and v and all(type(x) in (int, float) for x in v) for v in params.values()):
        raise QuestionError(f"{where}: params must map each name to a non-empty list of numbers.")
    answer = _text(item, "answer", where)
    rel_tol = item.get("rel_tol", DEFAULT_REL_TOL)
    if type(rel_tol) not in (int, float) or not 0 <= rel_tol < 1:
        raise QuestionError(f"{where}: rel_tol must be a number in [0, 1).")
    mistakes = []
    for m in item.get("mistakes", []):
        if not isinstance(m, dict) or set(m) != {"answer", "explain"}:
            raise QuestionError(f"{where}: each of mistakes must have exactly answer and explain.")
        mistakes.append((_text(m, "answer", where), _text(m, "explain", where)))
    q = Question(ident, kind, question, explain, answer=answer, params=dict(params),
                 unit=item.get("unit", ""), rel_tol=float(rel_tol), mistakes=tuple(mistakes))
    for values in _combinations(params):
        asked = Asked("", q, values, ())
        try:
            expected = asked.expected
            q.question.format(**values)
            q.explain.format(**values, answer=expected)
            for _, why in q.mistakes:
                why.format(**values, answer=expected)
            wrongs = [evaluate(wrong, values) for wrong, _ in q.mistakes]
        except (ValueError, KeyError, IndexError) as exc:
            raise QuestionError(f"{where}: with {values}: {exc}.") from None
        if not (isinstance(expected, int) or math.isfinite(expected)):
            raise QuestionError(f"{where}: with {values} the answer is not a finite number.")
        for (wrong, _), value in zip(q.mistakes, wrongs):
            if close(value, expected, q.rel_tol):
                raise QuestionError(f"{where}: with {values} the mistake {wrong!r} gives the right answer; "
                                    "pick parameters on which it differs.")
    return q


def _combinations(params: dict) -> list[dict]:
    combos = [{}]
    for name, values in params.items():
        combos = [{**c, name: v} for c in combos for v in values]
    return combos

