"""What recorded calls say about the tensors a learner's code built: their shapes, and for matrix
products the size of the axis each contracts, the shape of its result and of its operands
(flash-tiling's and flash-decoding's tiles of scores, and the keys each read)."""
import math

import torch

PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "mm", "einsum", "linear", "baddbmm", "addmm"}


def shapes_in(value) -> list[tuple]:
    """Shapes of the tensors one recorded argument summarises (a list of tensors too)."""
    if isinstance(value, dict) and isinstance(value.get("shape"), list) and all(type(s) is int for s in value["shape"]):
        return [tuple(value["shape"])]
    if isinstance(value, list):
        return [shape for item in value for shape in shapes_in(item)]
    return []


def float_shapes(ops) -> list[tuple]:
    """The shapes of the floating tensors the recorded calls took (their arguments, lists of them too)."""
    def found(value):
        if isinstance(value, dict) and "float" in str(value.get("dtype")):
            return shapes_in(value)
        return [shape for item in value for shape in found(item)] if isinstance(value, list) else []
    return [shape for op in ops for arg in [*op.get("args", []), *op.get("kwargs", {}).values()]
            for shape in found(arg)]


def _einsum(args) -> tuple[int, tuple] | None:
    if not args or not isinstance(args[0], str):
        return None
    equation = args[0].replace(" ", "")
    shapes = [shape for arg in args[1:] for shape in shapes_in(arg)]
    inputs_, arrow, output = equation.partition("->")
    terms = inputs_.split(",")
    if len(terms) != len(shapes):
        return None
    sizes, batch = {}, ()
    for term, shape in zip(terms, shapes):
        before, dots, after = term.partition("...")
        n = len(shape) - len(before) - len(after) if dots else 0
        letters, dims = before + after, shape[:len(before)] + shape[len(shape) - len(after):] if dots else shape
        if len(letters) != len(dims) or n < 0:
            return None
        if dots:
            try:
                batch = tuple(torch.broadcast_shapes(batch, shape[len(before):len(before) + n]))
            except RuntimeError:
                return None
        for letter, size in zip(letters, dims):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if not arrow:   # implicit output: the letters used once, in order, after the broadcast dimensions
        output = ("..." if "..." in inputs_ else "") + "".join(sorted(c for c in sizes if inputs_.count(c) == 1))
    before, dots, after = output.partition("...")
    if any(c not in sizes for c in before + after):
        return None
    contracted = math.prod(size for letter, size in sizes.items() if letter not in before + after)
    return contracted, tuple(sizes[c] for c in before) + (batch if dots else ()) + tuple(sizes[c] for c in after)


def operands(op) -> list[tuple]:
    """The shapes of a recorded matrix product's operands, in the order they are multiplied (an
    einsum's all of them), or [] for any other call."""
    name, args = op.get("name"), op.get("args", [])
    if name not in PRODUCTS or not isinstance(args, list):
        return []
    if name == "einsum":
        return [shape for arg in args[1:] for shape in shapes_in(arg)] if args and isinstance(args[0], str) else []
    shapes = [shape for arg in args for shape in shapes_in(arg)]
    if name in ("baddbmm", "addmm"):
        shapes = shapes[1:3]
    elif name == "__rmatmul__":
        shapes = shapes[1::-1]
    return shapes


def product(op) -> tuple[int, tuple] | None:
    """(size of the contracted axis, shape of the result) of a recorded matrix product, or None
    for any other call."""
    name, args = op.get("name"), op.get("args", [])
    if name not in PRODUCTS or not isinstance(args, list):
        return None
    if name == "einsum":
        return _einsum(args)
    shapes = operands(op)
    if len(shapes) < 2 or not shapes[0] or not shapes[1]:
        return None
    a, b = shapes[0], shapes[1]
    if name == "linear":   # input (..., n, c) times weight (m, c)ᵀ
        return (a[-1], (*a[:-1], b[0])) if len(b) == 2 else None
    a, b = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    try:
        batch = tuple(torch.broadcast_shapes(a[:-2], b[:-2]))
    except RuntimeError:
        return None
    return a[-1], (*batch, a[-2], b[-1])


def score_tiles(ops, hd) -> list[tuple]:
    """Result shapes of the recorded products that contract head_dim: the tiles of scores."""
    found = [product(op) for op in ops]
    return [shape for p in found if p is not None and p[0] == hd for shape in [p[1]]]


def score_operands(ops, hd) -> list[list[tuple]]:
    """Operand shapes of the recorded products that contract head_dim: what each tile of scores read."""
    return [operands(op) for op in ops if (p := product(op)) is not None and p[0] == hd]
