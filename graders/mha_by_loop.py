"""Grader of the mha-by-loop kata (katas/mha-by-loop/README.md).

Expected values come from the trusted CausalSelfAttention (reference/mha_by_loop.py) given the
same weights, never from the learner's copy of the class: editing the given class gains nothing.
"""
import ast
import re
import textwrap

import pytest
import torch

from graders.engine import expect
from graders.engine.failures import CheckFailed, LearnerRaised
from graders.engine.learner import describe_value
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, normal

# (B, T, C, H): H != head_dim in each. In the first, B, T, H, head_dim, B*H and C all differ, so the
# op recorder tells a head axis from batch, time and channels.
CONFIGS = [(2, 5, 24, 4), (3, 7, 30, 2), (2, 9, 32, 8)]
BLOCK = 16
MATMULS = {"matmul", "bmm", "mm", "einsum", "baddbmm", "linear", "tensordot", "__matmul__", "__rmatmul__"}
# One head's scores may also be a broadcast product summed up: (B, T, 1, hd) * (B, 1, T, hd).
PRODUCTS = MATMULS | {"mul", "__mul__"}
# What PyTorch says when a matmul's or a broadcast's shapes do not fit, or an unpacking comes up short.
SHAPE_ERROR = re.compile(r"shapes cannot be multiplied|size mismatch|must match the size of tensor|"
                         r"Expected size for first two dimensions|values to unpack")
CALL = "mha_by_loop(mha, x)"
AGAINST = "the module's own forward, mha(x)"


GIVEN = "CausalSelfAttention"


def given_class_source(kata) -> str:
    """The kit's given class, from the stub (learner-facing code), wrapped so that its imports stay
    out of the learner's namespace: appended to a file that holds only mha_by_loop."""
    stub = kata.stub_path.read_text(encoding="utf-8")
    tree = ast.parse(stub)
    parts = [ast.get_source_segment(stub, node) for node in tree.body
             if isinstance(node, (ast.Import, ast.ImportFrom))
             or (isinstance(node, ast.ClassDef) and node.name == GIVEN)]
    body = textwrap.indent("\n".join([*parts, f"return {GIVEN}"]), "    ")
    return f"\n\n\ndef _kit_given_class():\n{body}\n\n\n{GIVEN} = _kit_given_class()\n"


@pytest.fixture(scope="module")
def learner(learner, kata, device):
    """The learner's code, with the kit's given class where the file defines none (students often
    hand in the function alone): such a file runs in a second sandbox with the given class
    appended, and is scanned as it was handed in."""
    try:
        names = learner.names()
    except CheckFailed:   # a file that does not load fails each check with its own message
        names = [GIVEN]
    if GIVEN in names or "mha_by_loop" not in names:
        yield learner
        return
    with learner.appended(given_class_source(kata)) as extended:
        yield extended


def weights(rng, C):
    """A state_dict to inject. W ~ N(0, 1/C) keeps q, k and v at unit variance, so correctly scaled
    scores stay near unit variance and a wrong scale, layout or mask moves the output visibly."""
    return {"qkv.weight": normal(rng, 3 * C, C, std=C ** -0.5), "proj.weight": normal(rng, C, C, std=C ** -0.5)}


def case_text(x, H, about=""):
    B, T, C = x.shape
    return (f"x: {str(x.dtype).removeprefix('torch.')} ({B}, {T}, {C}), standard normal; "
            f"mha = CausalSelfAttention({C}, {H}, block_size={BLOCK}) in eval mode, weights injected "
            f"(W ~ N(0, 1/{C}))" + (f"; {about}" if about else ""))


def build(learner, device, sd, H):
    """The learner's copy of the given class: built, cast to the weights' dtype, moved, weights
    injected, eval mode."""
    C = sd["proj.weight"].shape[0]
    return inject(learner, learner.CausalSelfAttention(C, H, BLOCK), sd, device=device, exact=True,
                  call=f"CausalSelfAttention({C}, {H}, {BLOCK})",
                  problem="CausalSelfAttention does not hold the weights the grader injects: "
                  "do not modify the given CausalSelfAttention.")


def module(cls, sd, H):
    """A trusted module (the reference class) in float64, holding the weights ``sd``."""
    m = cls(sd["proj.weight"].shape[0], H, BLOCK).double().eval()
    m.load_state_dict({k: v.double() for k, v in sd.items()})
    return m


@recorded
def forward(cls, sd, H, x):
    """What a trusted module computes, in float64 on the CPU, returned in x's dtype."""
    with torch.no_grad():
        return module(cls, sd, H)(x.double()).to(x.dtype)


@recorded
def given_layout(cls, C, H):
    """The parameters' and buffers' shapes and the state_dict keys of the original given class."""
    m = cls(C, H, BLOCK)
    return {"parameters": {k: list(v.shape) for k, v in m.named_parameters()},
            "buffers": {k: list(v.shape) for k, v in m.named_buffers()}, "state_dict": list(m.state_dict())}


def expected(bugs, sd, H, x):
    """What the original module computes: the given class as the reference ships it."""
    return forward(bugs.reference.CausalSelfAttention, sd, H, x)


@recorded
def looped(mha_by_loop, cls, sd, H, x):
    """A trusted mha_by_loop (the reference's or a bug oracle's), on a trusted module."""
    with torch.no_grad():
        return mha_by_loop(module(cls, sd, H), x.double()).to(x.dtype)


def loop(impl, sd, H, x):
    return looped(impl.mha_by_loop, impl.CausalSelfAttention, sd, H, x)


def transposed(sd, qkv, proj):
    """The weights with each (C, C) block of qkv.weight and/or proj.weight transposed."""
    C = sd["proj.weight"].shape[0]
    return {"qkv.weight": torch.cat([w.T for w in sd["qkv.weight"].split(C)]) if qkv else sd["qkv.weight"],
            "proj.weight": sd["proj.weight"].T if proj else sd["proj.weight"]}


def diagnosis(bugs, got, sd, H, x, tol):
    """The known bug behind a wrong output. ``x @ W`` for ``x @ W.T`` is the module on transposed
    weights: the oracle forgets the transpose on qkv's blocks; a learner may forget it on proj's too,
    or on proj's only."""
    code = bugs.match(got, lambda impl: loop(impl, sd, H, x), **tol)
    if code is None and any(expect.same(got, expected(bugs, transposed(sd, *where), H, x), **tol)
                            for where in ((True, True), (False, True))):
        return "missing-weight-transpose"
    return code


def guarded(call_learner, C, *, call, case):
    """``call_learner()``; a shape error gets a sentence on which dimension of the fused weight
    holds Q, K and V."""
    try:
        return call_learner()
    except LearnerRaised as exc:
        if exc.type_name is None or not SHAPE_ERROR.search(exc.message):
            raise
        expect.fail(f"mha_by_loop hit a shape error. If it comes from slicing the fused weight: mha.qkv.weight "
                    f"is (3C, C) = ({3 * C}, {C}), and dim 0 holds Q, K and V stacked: rows 0..{C - 1} are W_q, "
                    f"{C}..{2 * C - 1} W_k, {2 * C}..{3 * C - 1} W_v. Dim 1 holds the {C} input channels. "
                    "Slice dim 0, `mha.qkv.weight.split(C, dim=0)`, and multiply `x @ W.T` as nn.Linear does.",
                    call=call, case=case, got=exc.message, output=exc.output,
                    expected=f"a (B, T, {C}) tensor; head i uses channels i*head_dim to (i+1)*head_dim of q, k, v")


def operand_shapes(op):
    """Shapes of the tensors a recorded call received (einsum may get them as a list)."""
    shapes = []
    for arg in [*op.get("args", []), *op.get("kwargs", {}).values()]:
        for a in arg if isinstance(arg, list) else [arg]:
            if isinstance(a, dict) and isinstance(a.get("shape"), list):
                shapes.append(tuple(a["shape"]))
    return shapes


def attention_product(op, B, T, H, hd):
    """"one head" for a product of one head's q, k, v or weights, e.g. (B, T, hd) @ (B, hd, T); "all
    heads" for a matmul whose operands carry a head axis, (B, H, T, hd) or (B*H, T, hd); None for
    other calls (a projection's operands have C channels). Only matmuls count as all heads: a loop
    may well scale or index a (B, T, H, hd) view."""
    if op.get("kind") != "function" or op.get("name") not in PRODUCTS:
        return None
    shapes = operand_shapes(op)
    dims = {d for s in shapes for d in s}
    if len(shapes) < 2 or hd not in dims or not dims <= {1, B, T, hd, H, B * H}:
        return None
    if dims & {H, B * H}:
        return "all heads" if op.get("name") in MATMULS else None
    return "one head"


def op_text(op):
    return f"{op.get('name')}({', '.join(str(s) for s in operand_shapes(op))})"


def test_matches_module(learner, bugs, kata, rng, device):
    """equals the module's forward in float64, on several (B, T, C, H)"""
    tol = kata.tolerance("float64")
    for B, T, C, H in CONFIGS:
        sd, x = weights(rng, C), normal(rng, B, T, C)
        case = case_text(x, H)
        got = guarded(lambda: learner.mha_by_loop(build(learner, device, sd, H), x), C, call=CALL, case=case)
        # A bug is matched within float32's tolerance: code whose softmax runs in float32 inside
        # (Llama's) makes its mistake as surely, and every oracle differs from the module by far more.
        expect.array(got, expected(bugs, sd, H, x), call=CALL, case=case, device=device, what="the output",
                     against=AGAINST, diagnose=lambda: diagnosis(bugs, got, sd, H, x, kata.tolerance("float32")),
                     **tol, float32_inside=kata.tolerance("float32"))


def test_per_head_loop(learner, kata, rng, device):
    """a Python loop over the heads: per-head matmuls, no mha(x), no SDPA, nothing of all heads at once"""
    B, T, C, H = CONFIGS[0]
    hd = C // H
    sd, warm_up, x = weights(rng, C), normal(rng, B, T, C), normal(rng, B, T, C)
    case = case_text(x, H, "every torch call recorded")
    # A first call lets lazy imports happen before recording. The recorded call gets a fresh module
    # (a loop that edits the weights in place fails eval-no-grad-safe only) and a fresh x (no
    # earlier call saw it, so memoised outputs cannot skip the ops).
    guarded(lambda: learner.mha_by_loop(build(learner, device, sd, H), warm_up), C, call=CALL, case=case)
    m = build(learner, device, sd, H)
    with learner.recording() as ops:
        guarded(lambda: learner.mha_by_loop(m, x), C, call=CALL, case=case)
    per_head = f"{H} heads, each with (B, T, hd) operands: ({B}, {T}, {hd}) @ ({B}, {hd}, {T}) for the scores, " \
               f"({B}, {T}, {T}) @ ({B}, {T}, {hd}) for the output"

    called = [op for op in ops if op.get("kind") == "module" and op.get("name") == "CausalSelfAttention"]
    expect.that(not called, "mha_by_loop calls the module itself, mha(x): that is the vectorised computation, "
                "not a loop over heads.", call=CALL, case=case, got=f"{len(called)} call(s) of CausalSelfAttention",
                expected=f"no call of mha; {per_head}", diagnose=lambda: "not-a-loop")
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "mha_by_loop uses a library attention: this kata is to write each head's attention "
                "yourself.", call=CALL, case=case, got=", ".join(used),
                expected=f"attention written by hand: {per_head}", diagnose=lambda: "not-a-loop")
    kinds = [(op, attention_product(op, B, T, H, hd)) for op in ops]
    batched = [op for op, kind in kinds if kind == "all heads"]
    expect.that(not batched, f"mha_by_loop multiplies tensors that hold all {H} heads at once (the module's "
                "vectorised code, or mha.forward): a `for` that only builds them is not a loop over heads.",
                call=CALL, case=case, got=f"{op_text(batched[0])}" if batched else None,
                expected=per_head, diagnose=lambda: "not-a-loop")
    singles = [op for op, kind in kinds if kind == "one head"]
    expect.that(len(singles) >= H, f"The recorder saw {len(singles)} products of a single head's tensors, fewer "
                f"than the {H} heads: write each head's attention with matmul (or einsum) on its (B, T, hd) slices.",
                call=CALL, case=case, got=", ".join(op_text(op) for op in singles) or "no per-head matmul",
                expected=per_head, diagnose=lambda: "not-a-loop")
    # The loop's values are the value checks' business: a true loop with a wrong scale keeps these points.
    check_untampered(learner, call=CALL, case=case)


def test_eval_no_grad_safe(learner, kata, rng, device):
    """eval mode, no-grad safe: changes neither x nor a frozen module, and gives the same output when x requires grad"""
    B, T, C, H = CONFIGS[2]
    sd, x = weights(rng, C), normal(rng, B, T, C)
    m = build(learner, device, sd, H)
    # Under torch.no_grad() nothing tracks gradients, so an in-place edit of a weight goes through
    # silently; frozen weights (requires_grad=False) are the same situation in the sandbox.
    m.requires_grad_(False)
    case = case_text(x, H, "weights frozen (requires_grad=False), as under torch.no_grad()")
    frozen, (_, x_after), _ = guarded(lambda: learner.mha_by_loop.echo(m, x), C, call=CALL, case=case)
    expect.form(frozen, torch.Tensor, x.shape, dtype=x.dtype, what="the output", device=device, call=CALL,
                case=case)
    problem = expect.mismatch(x_after, x, rtol=0.0, atol=0.0)
    expect.that(problem is None, "mha_by_loop modified its input x in place.", call=CALL, case=case,
                got=f"x after the call: {problem}",
                expected="x unchanged: compute new tensors, not x *= ... or x.add_(...)")
    expect.that(learner.get(m, "training") is False, "mha_by_loop switched the caller's module to train mode.",
                call=CALL, case=case, got="mha.training == True after the call",
                expected="mha left in eval mode: do not call mha.train() (or mha.eval() on someone else's module)")
    after = m.state_dict()
    for key, value in sd.items():
        problem = expect.mismatch(after[key], value, rtol=0.0, atol=0.0) \
            if isinstance(after, dict) and key in after else "missing from mha.state_dict()"
        expect.that(problem is None, f"mha_by_loop changed the module's weights: {key} differs after the call. "
                    "An in-place operation on a weight (through .data, or under torch.no_grad()) corrupts the "
                    "caller's model.", call=CALL, case=case, got=f"{key} after the call: {problem}",
                    expected=f"{key} as injected: build new tensors (W.T, W * s, torch.cat) instead of editing it")

    case = case_text(x, H, "x.requires_grad = True, as in training; compared with the call on frozen weights")
    x_grad = x.clone().requires_grad_(True)
    m.requires_grad_(True)
    try:
        got = guarded(lambda: learner.mha_by_loop(m, x_grad), C, call=CALL, case=case)
    except LearnerRaised as exc:
        if exc.type_name is None:
            raise
        expect.fail("mha_by_loop fails when x requires grad: it must be an ordinary differentiable function "
                    "(no .numpy(), no in-place edits of x or of the weights).", call=CALL, case=case,
                    got=exc.message, expected="the module's output, computed with torch operations", output=exc.output)
    # Its own output without gradients is the yardstick: the values are the value checks' business.
    expect.form(got, torch.Tensor, x.shape, dtype=x.dtype, what="the output", device=device, call=CALL, case=case)
    problem = expect.mismatch(got, frozen, **kata.tolerance("float64"))
    expect.that(problem is None, "mha_by_loop gives another output when x requires grad.", call=CALL, case=case,
                got=f"compared with the call on frozen weights: {problem}",
                expected="the same output with and without gradients")


def test_given_class_unchanged(learner, bugs, kata, rng, device):
    """the given CausalSelfAttention still holds the original layers and buffer and computes the original module"""
    B, T, C, H = CONFIGS[1]
    tol = kata.tolerance("float64")
    sd, x = weights(rng, C), normal(rng, B, T, C)
    case = case_text(x, H)
    m = build(learner, device, sd, H)
    own = m(x)   # before mha_by_loop runs: a loop that edits the weights fails eval-no-grad-safe, not this
    call = f"CausalSelfAttention({C}, {H}, {BLOCK})"
    # mha_by_loop must have been written: a stub earns nothing here. Its values are judged elsewhere.
    out = guarded(lambda: learner.mha_by_loop(m, x), C, call=CALL, case=case)
    expect.form(out, torch.Tensor, x.shape, dtype=x.dtype, what="the output", device=device, call=CALL, case=case)
    info, layout = learner.module_info(m), given_layout(bugs.reference.CausalSelfAttention, C, H)
    got = {"parameters": {k: v[0] for k, v in info["parameters"].items()},
           "buffers": {k: v[0] for k, v in info["buffers"].items()}, "state_dict": info["state_dict"]}
    expect.that(got == layout, "Your CausalSelfAttention no longer holds the original layers and buffer: do not "
                "modify the given CausalSelfAttention.", call=f"{call}: parameters, buffers, state_dict", case=case,
                got=str(got), expected=str(layout))
    expect.type_of(own, torch.Tensor, call=f"{call}(x)", case=case, what="the module's output")
    want = expected(bugs, sd, H, x)
    problem = expect.mismatch(own, want, **tol) if tuple(own.shape) == tuple(want.shape) \
        else f"shape {tuple(own.shape)} instead of {tuple(want.shape)}"
    expect.that(problem is None, "Your CausalSelfAttention no longer computes the original module: do not modify "
                "the given CausalSelfAttention (the grader compares with the original anyway).", call=f"{call}(x)",
                case=case, got=f"{describe_value(own)}: {problem}",
                expected="the output of the original CausalSelfAttention with the same weights")
    check_untampered(learner, call=f"{call}: parameters, buffers, state_dict", case=case)
