"""Grader of the flash-decoding kata (katas/flash-decoding/README.md)."""
import math

import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import CheckFailed, SandboxFailed, sentence
from graders.engine.learner import describe_value
from graders.engine.products import float_shapes, score_operands, score_tiles
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import normal

# (B, H, Tq, Tc, head_dim): B != H != head_dim, one query (decoding) and several.
PARTIAL_CASES = [((2, 3, 1, 13, 5), torch.float64), ((3, 2, 4, 7, 6), torch.float64), ((2, 3, 1, 13, 5), torch.float32)]
HUGE = 1e3   # scores near 1e3: exp overflows float32 beyond 88.7 and float64 beyond 709.8
# (B, H, Tq, Tk, head_dim, cut points): ragged, uneven chunks (of 1 key too), in the keys' order or not.
MERGE_CASES = [((2, 3, 1, 29, 5, (0, 3, 4, 17, 29)), torch.float64, "list"),
               ((3, 2, 3, 20, 6, (0, 11, 20)), torch.float64, "stacked"),
               ((2, 3, 1, 29, 5, (0, 9, 10, 25, 29)), torch.float32, "reversed")]
HUGE_CASE = (2, 3, 1, 30, 5, (0, 7, 8, 21, 30))
# Empty partials first, between and last; the keys cut as in MERGE_CASES.
EMPTY_CASES = [((2, 3, 1, 29, 5, (0, 0, 3, 4, 17, 17, 29, 29)), torch.float64, "list"),
               ((3, 2, 3, 20, 6, (0, 11, 11, 20)), torch.float32, "stacked")]
# (B, H, Tq, Tk, head_dim, n_splits): caches no split count divides, one query and several.
SPLIT_CASES = [((2, 3, 1, 37, 5, 4), torch.float64), ((3, 2, 1, 50, 6, 3), torch.float64),
               ((2, 3, 4, 29, 5, 5), torch.float64), ((2, 3, 1, 37, 5, 4), torch.float32)]
# Tk = 14: one split, a divisor, a ragged last split (4, 4, 4, 2), an empty last split with
# n_splits < Tk (3, 3, 3, 3, 2, 0), one key each, and six empty splits.
COUNT_SHAPE, COUNTS = (2, 3, 1, 14, 5), (1, 2, 4, 6, 14, 20)
HALF_LEVEL = 100.0   # float16 keeps 0.06 of an lse near 100: the merge's weights off by per cents
HALF_SHAPE = (2, 3, 1, 40, 8, (0, 9, 21, 33, 40), 5)   # ..., the cut for the merge, n_splits
# Recorded products: head_dim = 6 is no chunk's length (14, 14, 12 and 5), so a product that
# contracts head_dim is a chunk's scores and one that contracts the keys is not.
CHUNK_SHAPE, CHUNK_SPLITS = (2, 3, 1, 40, 6), (3, 8)
# KV groups (B, H, H_kv, Tq, Tk, head_dim): groups of 2 and 3 query heads over 2 or 3 KV heads (the
# grouping of h // n_rep and of h % H_kv then differ) and one KV head for all (MQA); one query and several.
GQA_PARTIAL_CASES = [((2, 4, 2, 1, 13, 5), torch.float64), ((3, 6, 3, 3, 7, 4), torch.float32)]
GQA_SPLIT_CASES = [((2, 6, 2, 1, 29, 5, 4), torch.float64), ((3, 4, 2, 2, 19, 6, 3), torch.float64),
                   ((2, 4, 1, 1, 23, 5, 5), torch.float32)]
# Recorded products of a grouped cache: head_dim = 7 is no split's length (14, 14 and 12), and the
# 3 query rows of a group are fewer than any split's keys, so a score product's larger operand is its keys.
READ_SHAPE, READ_SPLITS = (2, 6, 2, 1, 40, 7), 3
CASE = "q: {dtype} ({B}, {H}, {Tq}, {hd}), k and v: ({B}, {Hkv}, {Tk}, {hd}), standard normal"
HALF = (torch.float16, torch.bfloat16)


def inputs(rng, B, H, Tq, Tk, hd, dtype=torch.float64, Hkv=None):
    """q (B, H, Tq, hd), k and v (B, Hkv, Tk, hd) (Hkv = H unless given): unit variance, so correctly
    scaled scores are too."""
    return tuple(normal(rng, B, heads, T, hd).to(dtype) for heads, T in ((H, Tq), (Hkv or H, Tk), (Hkv or H, Tk)))


def shifted(rng, B, H, Tq, Tk, hd, level, dtype=torch.float64):
    """q, k, v whose scaled scores all sit near ``level`` with an O(1) spread: q's and k's first
    components set to sqrt(level · sqrt(hd)), so a chunk of n keys has an lse near level + log n."""
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    q[..., 0] = k[..., 0] = math.sqrt(level * math.sqrt(hd))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def spread(rng, B, H, Tq, Tk, hd, dtype=torch.float64):
    """q and k scaled up so that the scores have a std of HUGE / 3: within a chunk they spread over
    thousands, and so do the chunks' lses (shifting by any but the largest overflows)."""
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    return (q * math.sqrt(HUGE / 3)).to(dtype), (k * math.sqrt(HUGE / 3)).to(dtype), v.to(dtype)


def case_text(B, H, Tq, Tk, hd, dtype=torch.float64, about="", Hkv=None):
    text = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, H=H, Hkv=Hkv or H, Tq=Tq, Tk=Tk, hd=hd)
    return text + (f"; {about}" if about else "")


def wide(dtype) -> torch.dtype:
    """The dtype partials and merges are kept in: the input's, at least float32."""
    return torch.promote_types(dtype, torch.float32)


def sdpa(q, k, v):
    """F.scaled_dot_product_attention in float64 (no mask: one query attends to the whole cache;
    k and v with H_kv heads read by groups of query heads, enable_gqa)."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)   # (B, H, Tq, hd)


def logsumexp(q, k):
    """torch.logsumexp of the scaled scores over the keys, in float64 (query head h against KV head
    h // n_rep)."""
    k = k.double().repeat_interleave(q.size(1) // k.size(1), dim=1)   # (B, H, Tk, hd)
    scores = q.double() @ k.transpose(-2, -1) / math.sqrt(q.size(-1))   # (B, H, Tq, Tk)
    return torch.logsumexp(scores, dim=-1)   # (B, H, Tq)


def partials(q, k, v, cuts, dtype):
    """(out_j, lse_j) of the chunks k[:, :, a:b] for consecutive cut points, from SDPA and
    torch.logsumexp in float64, then cast to ``dtype``; an empty chunk gives zeros and -inf."""
    outs, lses = [], []
    for a, b in zip(cuts, cuts[1:]):
        if a == b:
            outs.append(torch.zeros_like(q, dtype=torch.float64))
            lses.append(torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64))
        else:
            outs.append(sdpa(q, k[:, :, a:b], v[:, :, a:b]))
            lses.append(logsumexp(q, k[:, :, a:b]))
    return [o.to(dtype) for o in outs], [s.to(dtype) for s in lses]


def merged(outs, lses):
    """The exact merge of partials, in float64 from torch's own functions: the lse of all the
    chunks is torch.logsumexp of theirs, and chunk j's weight is softmax over the lses."""
    outs, lses = torch.stack(list(outs)).double(), torch.stack(list(lses)).double()   # (n, ...)
    weights = torch.softmax(lses, dim=0)   # (n, B, H, Tq): exp(lse_j - lse)
    return (weights[..., None] * outs).sum(dim=0), torch.logsumexp(lses, dim=0)


def arranged(outs, lses, how):
    """The partials as merge_partials is handed them: lists, stacked tensors, or lists reversed."""
    if how == "stacked":
        return torch.stack(outs), torch.stack(lses)
    return (outs[::-1], lses[::-1]) if how == "reversed" else (outs, lses)


def cut_text(cuts, how="list"):
    sizes = ", ".join(str(b - a) for a, b in zip(cuts, cuts[1:]))
    form = {"list": "lists", "stacked": "stacked tensors (n, ...)", "reversed": "lists, the last chunk first"}[how]
    return f"partials of chunks of {sizes} keys, as {form}"


def widen(value):
    if type(value) is torch.Tensor:
        return value.double()
    return [widen(v) for v in value] if type(value) in (list, tuple) else value


@recorded
def trusted(fn, *args, dtype, exact=False):
    """What a trusted implementation (the reference or a bug oracle) returns: computed in float64
    and cast to ``dtype``, or with ``exact`` on the arguments as they are (a precision check,
    whose bugs are the dtypes they compute in)."""
    with torch.no_grad():
        got = fn(*(args if exact else widen(args)))
    cast = lambda t: t.to(dtype) if type(t) is torch.Tensor else t   # noqa: E731
    return tuple(cast(t) for t in got) if type(got) is tuple else cast(got)


def diagnose_with(bugs, got, name, *args, dtype, tol, exact=False):
    """The known bug whose ``name`` on these arguments returns the learner's ``got``: the pair,
    else its output alone, else its lse alone."""
    compute = lambda impl: trusted(getattr(impl, name), *args, dtype=dtype, exact=exact)   # noqa: E731

    def part(i):
        def compute_part(impl):
            result = compute(impl)
            return result[i] if type(result) is tuple and len(result) == 2 else None
        return compute_part

    def diagnose():
        if dtype not in HALF and type(got) in (tuple, torch.Tensor) and any(
                type(t) is torch.Tensor and t.dtype in HALF for t in (got if type(got) is tuple else (got,))):
            return "merge-in-float16"   # half precision out of inputs that were not: whatever else it did
        code = bugs.match(got, compute, **tol)
        if code is None and type(got) is tuple and len(got) == 2:
            code = bugs.match(got[0], part(0), **tol) or bugs.match(got[1], part(1), **tol)
        return code

    return diagnose


def tensors(got, *, call, case, name, diagnose=None):
    """``name`` returned a pair of tensors (out, lse)."""
    expect.that(type(got) is tuple and len(got) == 2, f"{name} must return a pair (out, lse).", call=call, case=case,
                got=describe_value(got), expected="tuple (out (B, H, Tq, head_dim), lse (B, H, Tq))", diagnose=diagnose)
    for what, value, shape in (("the output", got[0], "(B, H, Tq, head_dim)"), ("lse", got[1], "(B, H, Tq)")):
        expect.that(type(value) is torch.Tensor, f"{sentence(what)} must be a tensor.", call=call, case=case,
                    got=describe_value(value), expected=f"a torch.Tensor of shape {shape}", diagnose=diagnose)


def judge_pair(got, expected, *, call, case, name, against, tol, device, diagnose, float32_inside=None):
    """got is the pair (out, lse), each equal to ``expected``'s in type, shape, dtype, device and values."""
    tensors(got, call=call, case=case, name=name, diagnose=diagnose)
    for i, what in enumerate(("the output", "lse")):
        expect.array(got[i], expected[i], call=call, case=case, what=what, diagnose=diagnose, device=device,
                     against=against[i], **tol, float32_inside=float32_inside)


PARTIAL_AGAINST = ("F.scaled_dot_product_attention over the chunk",
                   "torch.logsumexp(q @ k_chunk.transpose(-2, -1) / sqrt(head_dim), -1)")
WHOLE_AGAINST = ("F.scaled_dot_product_attention over all the chunks' keys",
                 "torch.logsumexp of the scaled scores over all the chunks' keys")
MERGED_AGAINST = ("Σ_j softmax(lses)_j · out_j in float64", "torch.logsumexp(lses, 0) in float64")


def conditioning(q, k):
    """The largest sum of |q_d k_d| / sqrt(head_dim) of any (query, key): an honest rounding of a
    score moves it by a few ulps of this, not of the score."""
    k = k.double().abs().repeat_interleave(q.size(1) // k.size(1), dim=1)   # (B, H, Tk, hd): each query head's keys
    return float((q.double().abs() @ k.transpose(-2, -1)).amax()) / math.sqrt(q.size(-1))


def split_call(n):
    return f"split_kv_decode(q, k, v, n_splits={n})"


def judge_split(learner, bugs, kata, q, k, v, n, *, case, device, tol=None, exact=False):
    """split_kv_decode(q, k, v, n) equals SDPA, in q's dtype."""
    tol = tol or kata.tolerance(q.dtype)
    got = learner.split_kv_decode(q, k, v, n)
    diagnose = diagnose_with(bugs, got, "split_kv_decode", q, k, v, n, dtype=q.dtype, tol=tol, exact=exact)
    expect.array(got, sdpa(q, k, v).to(q.dtype), call=split_call(n), case=case, what="the output", diagnose=diagnose,
                 device=device, against="F.scaled_dot_product_attention in float64", **tol,
                 float32_inside=expect.float32_inside(kata, q.dtype))


# --- what recorded calls say about the chunks (graders/engine/products.py reads them) -------------

def score_blocks(ops, hd) -> list[int]:
    """How many scores each recorded product that contracts head_dim computes."""
    return [math.prod(shape) for shape in score_tiles(ops, hd)]


def recorded_split(learner, q, k, v, n):
    """The learner's result and every torch function its call ran (after one unrecorded call on
    other inputs, so that lazy imports and memoised results cannot hide the ops)."""
    learner.split_kv_decode(torch.flip(q, dims=(-2,)), k, v, n)
    with learner.recording() as ops:
        result = learner.split_kv_decode(q, k, v, n)
    return result, ops


# --- checks --------------------------------------------------------------------------------------

def judge_partial(learner, bugs, kata, q, k, v, *, case, device):
    """partial_attention(q, k, v) equals SDPA over the chunk and torch.logsumexp of its scaled
    scores, in q's dtype, each to a rounding of its scores' conditioning."""
    dtype, scores = q.dtype, conditioning(q, k)
    out_tol = kata.tolerance(dtype, magnitude=scores * expect.magnitude(v))
    lse_tol = kata.tolerance(dtype, magnitude=scores)
    call = "partial_attention(q, k_chunk, v_chunk)"
    got = learner.partial_attention(q, k, v)
    diagnose = diagnose_with(bugs, got, "partial_attention", q, k, v, dtype=dtype,
                             tol=kata.tolerance("float32", magnitude=scores * expect.magnitude(v)))
    tensors(got, call=call, case=case, name="partial_attention", diagnose=diagnose)
    expected = sdpa(q, k, v).to(dtype), logsumexp(q, k).to(dtype)
    for i, (what, tol) in enumerate((("the output", out_tol), ("lse", lse_tol))):
        expect.array(got[i], expected[i], call=call, case=case, what=what, diagnose=diagnose, device=device,
                     against=PARTIAL_AGAINST[i], **tol, float32_inside=expect.float32_inside(kata, dtype))


def test_partial_matches_sdpa(learner, bugs, kata, rng, device):
    """partial_attention: out equals SDPA over the chunk and lse (B, H, Tq) torch.logsumexp of its scaled scores, float64 and float32, scores near 1e3 too"""
    cases = [(inputs(rng, *shape, dtype=dtype), dtype, "") for shape, dtype in PARTIAL_CASES]
    B, H, Tq, Tc, hd = PARTIAL_CASES[0][0]
    cases += [(shifted(rng, B, H, Tq, Tc, hd, HUGE, dtype), dtype, "scores near 1e3, spread over a few units "
               "(a plain exp overflows)") for dtype in (torch.float64, torch.float32)]
    cases += [(spread(rng, B, H, Tq, Tc, hd, dtype), dtype, "q and k scaled up: scores of std 333 (exp of a score "
               "minus any but the largest overflows)") for dtype in (torch.float64, torch.float32)]
    for (q, k, v), dtype, about in cases:
        B, H, Tq, hd = q.shape
        judge_partial(learner, bugs, kata, q, k, v, case=case_text(B, H, Tq, k.size(-2), hd, dtype, about),
                      device=device)


def test_partial_empty_chunk(learner, bugs, kata, rng, device):
    """partial_attention on an empty chunk (no key): out zeros (B, H, Tq, head_dim) and lse -inf (B, H, Tq)"""
    for (B, H, Tq, hd), dtype in (((2, 3, 1, 5), torch.float64), ((3, 2, 4, 6), torch.float32)):
        q, k, v = inputs(rng, B, H, Tq, 0, hd, dtype)
        call = "partial_attention(q, k[:, :, :0], v[:, :, :0])"
        case = case_text(B, H, Tq, 0, hd, dtype, "an empty chunk: Σ exp(score) over no key is 0")
        got = learner.partial_attention(q, k, v)
        diagnose = diagnose_with(bugs, got, "partial_attention", q, k, v, dtype=dtype, tol=kata.tolerance("float32"))
        expected = torch.zeros(B, H, Tq, hd, dtype=dtype), torch.full((B, H, Tq), float("-inf"), dtype=dtype)
        judge_pair(got, expected, call=call, case=case, name="partial_attention", tol=kata.tolerance(dtype),
                   against=("zeros: no key, nothing to average", "-inf: the log of an empty sum"), device=device,
                   diagnose=diagnose)


def judge_merge(learner, bugs, kata, outs, lses, expected, *, call, case, against, device, magnitude=0.0):
    """merge_partials(outs, lses) equals ``expected`` (float64), in the partials' dtype."""
    dtype = lses[0].dtype
    tol = kata.tolerance(dtype, magnitude=magnitude)
    got = learner.merge_partials(outs, lses)
    diagnose = diagnose_with(bugs, got, "merge_partials", outs, lses, dtype=dtype,
                             tol=kata.tolerance("float32", magnitude=magnitude))
    judge_pair(got, tuple(t.to(dtype) for t in expected), call=call, case=case, name="merge_partials",
               against=against, tol=tol, device=device, diagnose=diagnose,
               float32_inside=expect.float32_inside(kata, dtype))


def test_merge_equals_whole(learner, bugs, kata, rng, device):
    """merge_partials of the partials of any cut of the keys (ragged, uneven, in any order, lists or stacked) equals attention over all of them: out and lse"""
    for (B, H, Tq, Tk, hd, cuts), dtype, how in MERGE_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        outs, lses = arranged(*partials(q, k, v, cuts, dtype), how)
        case = case_text(B, H, Tq, Tk, hd, dtype, cut_text(cuts, how))
        judge_merge(learner, bugs, kata, outs, lses, (sdpa(q, k, v), logsumexp(q, k)),
                    call="merge_partials(outs, lses)", case=case, against=WHOLE_AGAINST, device=device)


def test_merge_huge_lse_stays_finite(learner, bugs, kata, rng, device):
    """lses near 1e3, or spread over thousands (a plain exp overflows in float32 and in float64): the merge is finite and equals the exact merge"""
    B, H, Tq, Tk, hd, cuts = HUGE_CASE
    for kind, dtype in (("shifted", torch.float64), ("shifted", torch.float32), ("spread", torch.float64),
                        ("spread", torch.float32)):
        q, k, v = shifted(rng, B, H, Tq, Tk, hd, HUGE) if kind == "shifted" else spread(rng, B, H, Tq, Tk, hd)
        outs, lses = partials(q, k, v, cuts, dtype)
        about = ("scores near 1e3, lses near 1e3" if kind == "shifted" else
                 "scores of std 333: lses spread over thousands (exp of an lse minus any but the largest overflows)")
        case = case_text(B, H, Tq, Tk, hd, dtype, about + "; " + cut_text(cuts))
        # A merge that runs pairwise rounds each running lse near 1e3: its weights move by ulps of that.
        judge_merge(learner, bugs, kata, outs, lses, merged(outs, lses), call="merge_partials(outs, lses)", case=case,
                    against=MERGED_AGAINST, device=device, magnitude=expect.magnitude(*lses) * expect.magnitude(*outs))


def test_merge_ignores_empty_partials(learner, bugs, kata, rng, device):
    """empty partials (out 0, lse -inf) first, between and last among the others change nothing: out and lse over the other chunks' keys"""
    for (B, H, Tq, Tk, hd, cuts), dtype, how in EMPTY_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        outs, lses = arranged(*partials(q, k, v, cuts, dtype), how)
        case = case_text(B, H, Tq, Tk, hd, dtype, cut_text(cuts, how) + " (0: empty, lse -inf, out zeros)")
        judge_merge(learner, bugs, kata, outs, lses, (sdpa(q, k, v), logsumexp(q, k)),
                    call="merge_partials(outs, lses)", case=case, against=WHOLE_AGAINST, device=device)


def test_split_matches_sdpa(learner, bugs, kata, rng, device):
    """split_kv_decode equals F.scaled_dot_product_attention, float64 and float32, one query and several"""
    for (B, H, Tq, Tk, hd, n), dtype in SPLIT_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd, dtype)
        chunk = math.ceil(Tk / n)
        about = f"splits of {chunk} keys, the last of {Tk - (n - 1) * chunk}"
        judge_split(learner, bugs, kata, q, k, v, n, device=device, case=case_text(B, H, Tq, Tk, hd, dtype, about))


def test_split_any_count(learner, bugs, kata, rng, device):
    """the same for every n_splits: 1, a divisor of Tk, a ragged last split, an empty last split, Tk, more than Tk (empty splits)"""
    B, H, Tq, Tk, hd = COUNT_SHAPE
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    for n in COUNTS:
        chunk = math.ceil(Tk / n)
        sizes = [max(0, min(chunk, Tk - i * chunk)) for i in range(n)]
        about = f"the same q, k, v for every n_splits of {COUNTS}; splits of {', '.join(map(str, sizes))} keys"
        judge_split(learner, bugs, kata, q, k, v, n, device=device, case=case_text(B, H, Tq, Tk, hd, about=about))


def test_gqa_matches_sdpa(learner, bugs, kata, rng, device):
    """KV groups: k and v with H_kv heads, query head h reading KV head h // (H // H_kv): partial_attention and split_kv_decode equal SDPA with enable_gqa=True, several H / H_kv, one query and several"""
    for (B, H, Hkv, Tq, Tc, hd), dtype in GQA_PARTIAL_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tc, hd, dtype, Hkv=Hkv)
        about = f"groups of {H // Hkv} query heads: head h reads KV head h // {H // Hkv}"
        judge_partial(learner, bugs, kata, q, k, v, case=case_text(B, H, Tq, Tc, hd, dtype, about, Hkv=Hkv),
                      device=device)
    for (B, H, Hkv, Tq, Tk, hd, n), dtype in GQA_SPLIT_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd, dtype, Hkv=Hkv)
        about = (f"groups of {H // Hkv} query heads: head h reads KV head h // {H // Hkv}"
                 f"{' (one KV head for all: MQA)' if Hkv == 1 else ''}; splits of {math.ceil(Tk / n)} keys")
        judge_split(learner, bugs, kata, q, k, v, n, device=device,
                    case=case_text(B, H, Tq, Tk, hd, dtype, about, Hkv=Hkv))


def test_half_inputs_merge_in_float32(learner, bugs, kata, rng, device):
    """half precision: float16 inputs give float32 partials; merge_partials keeps float32 partials with lses near 100 to float32's tolerance; split_kv_decode on float16 inputs is within float16 rounding of the float64 answer"""
    B, H, Tq, Tk, hd, cuts, n = HALF_SHAPE
    about = "scores near 100 (a chunk's lse near 100 + log of its length)"
    q, k, v = shifted(rng, B, H, Tq, Tk, hd, HALF_LEVEL, torch.float16)
    # partial_attention: the partials come back in float32 (a float16 lse near 100 keeps only 0.06).
    call, case = "partial_attention(q, k_chunk, v_chunk)", case_text(B, H, Tq, 9, hd, torch.float16, about)
    got = learner.partial_attention(q, k[:, :, :9], v[:, :, :9])
    tol = kata.tolerance("float32", magnitude=conditioning(q, k) * expect.magnitude(v))
    half = diagnose_with(bugs, got, "partial_attention", q, k[:, :, :9], v[:, :, :9], dtype=torch.float32, tol=tol,
                         exact=True)   # float16 partials are named by their dtype
    judge_pair(got, (sdpa(q, k[:, :, :9], v[:, :, :9]).float(), logsumexp(q, k[:, :, :9]).float()), call=call,
               case=case, name="partial_attention", against=PARTIAL_AGAINST, device=device, diagnose=half, tol=tol)
    # merge_partials of float32 partials: the exact merge of those very partials, to float32 rounding.
    outs, lses = partials(q, k, v, cuts, torch.float32)
    case = case_text(B, H, Tq, Tk, hd, torch.float16, about + "; " + cut_text(cuts) + ", float32")
    got = learner.merge_partials(outs, lses)
    tol = kata.tolerance("float32")   # measured: honest merges within 0.15 of it, float16 weights 15x out
    judge_pair(got, tuple(t.float() for t in merged(outs, lses)), call="merge_partials(outs, lses)", case=case,
               name="merge_partials", against=MERGED_AGAINST, tol=tol, device=device,
               diagnose=diagnose_with(bugs, got, "merge_partials", outs, lses, dtype=torch.float32, tol=tol,
                                      exact=True))
    # split_kv_decode: float16 out, within float16 rounding of the float64 answer on the same inputs.
    case = case_text(B, H, Tq, Tk, hd, torch.float16, about + f"; {n} splits of {math.ceil(Tk / n)} keys")
    judge_split(learner, bugs, kata, q, k, v, n, case=case, device=device, tol=kata.tolerance("float16"), exact=True)


def test_splits_are_chunks(learner, bugs, kata, rng, device):
    """split_kv_decode attends by chunks: no score product over more than ceil(Tk / n_splits) keys, every key scored, and no tensor of every key's scores (recorded calls)"""
    B, H, Tq, Tk, hd = CHUNK_SHAPE
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    for n in CHUNK_SPLITS:
        chunk = math.ceil(Tk / n)
        call = split_call(n)
        case = case_text(B, H, Tq, Tk, hd, about="every torch call recorded; a chunk's scores are a matrix product "
                         f"(@, matmul, bmm, einsum) that contracts head_dim = {hd}")
        _, ops = recorded_split(learner, q, k, v, n)
        blocks = score_blocks(ops, hd)
        most, need = B * H * Tq * chunk, B * H * Tq * Tk
        expect.that(sum(blocks) >= need, "Fewer scores were computed as matrix products than there are keys: compute "
                    "each split's scores q @ k_chunk.transpose(-2, -1) with @, matmul, bmm or einsum.", call=call,
                    case=case, got=f"{sum(blocks):,} scores from products contracting head_dim = {hd}",
                    expected=f"at least {need:,}: B · H · Tq · Tk")
        expect.that(max(blocks) <= most, f"A product computed the scores of more than one split's keys at once: each "
                    f"split of at most {chunk} keys is attended on its own (on a GPU, one thread block each), "
                    "never the whole cache's scores.", call=call, case=case,
                    got=f"a product of {max(blocks):,} scores", expected=f"at most {most:,}: B · H · Tq · {chunk}")
        # What defines a split apart: nothing holds every key's scores at once, however they were made
        # (chunk products joined, a broadcast multiply and a sum). k and v have the Tk axis too, with head_dim.
        whole = [shape for shape in float_shapes(ops) if Tk in shape and hd not in shape and math.prod(shape) >= need]
        expect.that(not whole, f"A tensor held the scores (or weights) of every key at once: each split of at most "
                    f"{chunk} keys must be attended on its own, its softmax too, and only the (out, lse) pairs merged.",
                    call=call, case=case, got=f"a tensor of shape {whole[0]}" if whole else None,
                    expected=f"nothing of {need:,} values or more with the whole cache's {Tk} keys as an axis, "
                             "but k and v themselves")
    check_untampered(learner, call=call, case=case)


def key_reads(ops, hd) -> list[int]:
    """The values each recorded score product (a product that contracts head_dim) read of the keys:
    its larger operand, the split's keys against a group's few query rows."""
    return [max(math.prod(shape) for shape in shapes) for shapes in score_operands(ops, hd) if shapes]


def test_kv_read_once_per_group(learner, bugs, kata, rng, device):
    """KV groups read once: split_kv_decode's score products read each KV head of the cache once for its whole group of query heads, never a copy per query head (recorded calls)"""
    B, H, Hkv, Tq, Tk, hd = READ_SHAPE
    n, n_rep = READ_SPLITS, H // Hkv
    q, k, v = inputs(rng, B, H, Tq, Tk, hd, Hkv=Hkv)
    call = split_call(n)
    case = case_text(B, H, Tq, Tk, hd, Hkv=Hkv, about=f"groups of {n_rep} query heads; every torch call recorded; a "
                     f"chunk's scores are a matrix product (@, matmul, bmm, einsum) that contracts head_dim = {hd}")
    _, ops = recorded_split(learner, q, k, v, n)
    need, cache = B * H * Tq * Tk, B * Hkv * Tk * hd
    expect.that(sum(score_blocks(ops, hd)) >= need, "Fewer scores were computed as matrix products than there are "
                "(query head, key) pairs: compute each split's scores with @, matmul, bmm or einsum.", call=call,
                case=case, got=f"{sum(score_blocks(ops, hd)):,} scores from products contracting head_dim = {hd}",
                expected=f"at least {need:,}: B · H · Tq · Tk")
    read = sum(key_reads(ops, hd))
    expect.that(read <= cache, f"The score products read the cached keys {read / cache:.3g} times over, where once "
                f"is enough: a KV head serves its {n_rep} query heads at once (k brought up to H heads, or a loop over "
                "the query heads, reads it once per query head). Put a group's query heads in the rows of one matrix, "
                "q.reshape(B, H_kv, n_rep * Tq, head_dim), and multiply it by the chunk's keys as they are: a 1-row "
                "product per head becomes one n_rep-row product per KV head.", call=call, case=case,
                got=f"{read:,} key values read by the score products",
                expected=f"at most {cache:,}: B · H_kv · Tk · head_dim, each cached key once",
                diagnose=lambda: "kv-read-per-query-head")
    check_untampered(learner, call=call, case=case)


def test_rejects_bad_arguments(learner, rng):
    """n_splits < 1, an empty cache (Tk = 0) and KV heads that do not divide the query heads raise ValueError or AssertionError"""
    B, H, hd = 2, 3, 5
    q, k, v = inputs(rng, B, H, 1, 10, hd)
    learner.split_kv_decode(q, k, v, 3)   # a valid call first: only bad ones may raise
    empty, two_heads = (k[:, :, :0], v[:, :, :0]), (k[:, :2], v[:, :2])
    for (kk, vv), n, why, hang in (((k, v), 0, "n_splits = 0: no split to attend", "ceil(Tk / 0)"),
                                   ((k, v), -2, "n_splits = -2", "a loop that steps by a negative chunk"),
                                   (empty, 2, "an empty cache (Tk = 0): the query has no key", ""),
                                   (two_heads, 2, "2 KV heads for 3 query heads: no whole number of groups", "")):
        call, case = split_call(n), case_text(B, H, 1, kk.size(-2), hd, about=why, Hkv=kk.size(1))
        wanted = "ValueError (or AssertionError) naming the bad argument"
        try:
            expect.refused(lambda: learner.split_kv_decode(q, kk, vv, n), call=call, case=case, expected=wanted,
                           returned="A bad argument was accepted.",
                           raised="A bad argument failed somewhere inside instead of being refused: check it yourself "
                                  "first.")
        except SandboxFailed as exc:
            # The valid call above came back, so this call's timeout (or crash) is the bad argument's doing.
            raise CheckFailed("A bad argument was not refused, and the call never came back: check the arguments "
                              "before any loop runs and raise ValueError" + (f" ({hang})." if hang else "."),
                              call=call, case=case, got=exc.message, expected=wanted) from None


def test_banned_api(learner, kata, rng, device):
    """no SDPA, nn.MultiheadAttention, flex_attention or torch's fused attention kernels: each chunk attended by hand"""
    (B, H, Tq, Tk, hd, n), _ = SPLIT_CASES[0]
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    call, case = split_call(n), case_text(B, H, Tq, Tk, hd)
    _, ops = recorded_split(learner, q, k, v, n)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The function uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="each chunk's scores, max, exp and sum by hand, merged by log-sum-exp",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
