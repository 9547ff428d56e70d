"""Grader of the flash-tiling kata (katas/flash-tiling/README.md)."""
import math

import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import CheckFailed, SandboxFailed, sentence
from graders.engine.learner import describe_value
from graders.engine.products import score_tiles, shapes_in
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import normal
from graders.engine.worker import _recorder

# (B, H, Tq, Tk, head_dim, block_q, block_k): B != H != head_dim, several key blocks with a ragged
# last one everywhere, so a running max that moves between blocks (the rescale bugs), a
# normalisation inside the loop and a dropped partial tile all show. Tq < Tk and Tq > Tk too.
SDPA_CASES = [(2, 3, 20, 20, 8, 8, 8), (2, 3, 13, 29, 6, 4, 7), (3, 2, 25, 11, 5, 6, 4)]
# Tile sizes on one input: single scores, ragged both ways, one query block and one key block as
# large as the sequences, and larger than them.
TILE_SHAPE = (2, 3, 19, 23, 8)
TILE_SIZES = [(1, 1), (4, 4), (5, 3), (3, 5), (16, 7), (19, 23), (64, 64)]
CAUSAL_TILE_SIZES = [(1, 1), (5, 3), (64, 64)]
# Causal: aligned tiles, a ragged diagonal (block_k does not divide the block's last position: a
# floor where a ceil is due drops keys), Tq < Tk (bottom-right, offset 18) and a single query.
CAUSAL_CASES = [(2, 3, 16, 16, 8, 4, 4), (2, 3, 20, 20, 8, 8, 6), (2, 3, 12, 30, 6, 5, 7), (2, 3, 1, 9, 8, 4, 4)]
LSE_CASES = [((2, 3, 13, 29, 6, 4, 7), False), ((3, 2, 25, 11, 5, 6, 4), False), ((2, 3, 20, 20, 8, 8, 6), True),
             ((2, 3, 12, 30, 6, 5, 7), True)]
HUGE_SHAPE = (2, 3, 20, 28, 8, 8, 8)
HUGE = 1e4   # the largest scores: exp overflows float32 beyond 88.7 and float64 beyond 709.8
# Recorded-shape checks: head_dim differs from every tile length (16, 8 and the ragged 8 of
# Tk = 40), so a product contracting head_dim is a score tile and one contracting keys is not.
SKIP_CASES = [(2, 3, 64, 64, 12, 16, 16), (2, 3, 24, 40, 12, 8, 16)]
FULL_SHAPE = (2, 3, 48, 80, 12, 16, 16)   # Tq != Tk, neither a multiple of the other's tiles' sizes
CASE = "q: {dtype} ({B}, {H}, {Tq}, {hd}), k and v: ({B}, {H}, {Tk}, {hd}), standard normal"


def inputs(rng, B, H, Tq, Tk, hd, dtype=torch.float64):
    """q (B, H, Tq, hd), k and v (B, H, Tk, hd): unit variance, so correctly scaled scores are too."""
    return tuple(normal(rng, B, H, T, hd).to(dtype) for T in (Tq, Tk, Tk))


def case_text(B, H, Tq, Tk, hd, dtype=torch.float64, about=""):
    text = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, H=H, Tq=Tq, Tk=Tk, hd=hd)
    return text + (f"; {about}" if about else "")


def call_text(bq, bk, causal=False):
    return f"flash_attention(q, k, v, block_q={bq}, block_k={bk}, causal={causal})"


def allowed_keys(Tq, Tk, causal, device=None):
    """Bool (Tq, Tk), True = may attend: all, or causal bottom-right aligned (query i at Tk - Tq + i)."""
    return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril(Tk - Tq if causal else Tk)


def sdpa(q, k, v, causal):
    """F.scaled_dot_product_attention in float64 with the bottom-right mask spelled out (its
    is_causal is top-left aligned when Tq != Tk): an oracle nobody here wrote."""
    qd, kd, vd = q.double(), k.double(), v.double()
    mask = allowed_keys(q.size(-2), k.size(-2), causal) if causal else None
    return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask).to(q.dtype)   # (B, H, Tq, hd)


def logsumexp(q, k, causal):
    """torch.logsumexp of the scaled scores over each query's allowed keys, in float64."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))   # (B, H, Tq, Tk)
    scores = scores.masked_fill(~allowed_keys(q.size(-2), k.size(-2), causal), float("-inf"))
    return torch.logsumexp(scores, dim=-1).to(q.dtype)   # (B, H, Tq)


@recorded
def trusted(fn, q, k, v, block_q, block_k, causal):
    """What a trusted implementation (the reference or a bug oracle) returns, computed in float64
    and cast to q's dtype: (out, lse), or whatever a bug returns in their place."""
    with torch.no_grad():
        got = fn(q.double(), k.double(), v.double(), block_q=block_q, block_k=block_k, causal=causal)
    cast = lambda t: t.to(q.dtype) if type(t) is torch.Tensor else t   # noqa: E731
    return tuple(cast(t) for t in got) if type(got) is tuple else cast(got)


def diagnose_with(bugs, kata, got, q, k, v, bq, bk, causal, magnitude=0.0):
    """The known bug whose result on this call is the learner's, matched within float32 rounding
    (of scores of ``magnitude``), so that a bug written with float32 tiles inside is named too."""
    tol = kata.tolerance("float32", magnitude=magnitude)
    compute = lambda impl: trusted(impl.flash_attention, q, k, v, bq, bk, causal)   # noqa: E731

    def part(i):
        def compute_part(impl):
            result = compute(impl)
            return result[i] if type(result) is tuple and len(result) == 2 else None
        return compute_part

    def diagnose():   # the pair, else the output alone, else lse alone
        code = bugs.match(got, compute, **tol)
        if code is None and type(got) is tuple and len(got) == 2:
            code = bugs.match(got[0], part(0), **tol) or bugs.match(got[1], part(1), **tol)
        return code

    return diagnose


def pair(got, *, call, case, diagnose=None):
    """flash_attention returned a pair (out, lse)."""
    expect.that(type(got) is tuple and len(got) == 2, "flash_attention must return a pair (out, lse).", call=call,
                case=case, got=describe_value(got), expected="tuple (out (B, H, Tq, head_dim), lse (B, H, Tq))",
                diagnose=diagnose)


def tensors(got, *, call, case, diagnose=None):
    """flash_attention returned a pair of tensors (out, lse): lse is not None, m or l in disguise."""
    pair(got, call=call, case=case, diagnose=diagnose)
    for what, value, shape in (("the output", got[0], "(B, H, Tq, head_dim)"), ("lse", got[1], "(B, H, Tq)")):
        expect.that(type(value) is torch.Tensor, f"{sentence(what)} must be a tensor.", call=call,
                    case=case, got=describe_value(value), expected=f"a torch.Tensor of shape {shape}",
                    diagnose=diagnose)


def judge_out(got, q, k, v, causal, *, call, case, tol, device, diagnose, kata):
    """out equals F.scaled_dot_product_attention's, in type, shape, dtype, device and values."""
    pair(got, call=call, case=case, diagnose=diagnose)
    expect.array(got[0], sdpa(q, k, v, causal), call=call, case=case, what="the output", diagnose=diagnose,
                 device=device, against="F.scaled_dot_product_attention" + (" with the bottom-right causal mask"
                                                                            if causal else ""),
                 **tol, float32_inside=expect.float32_inside(kata, q.dtype))


def judge_lse(got, q, k, causal, *, call, case, tol, device, diagnose, kata):
    """lse equals torch.logsumexp of the scaled scores over the allowed keys."""
    tensors(got, call=call, case=case, diagnose=diagnose)
    expect.array(got[1], logsumexp(q, k, causal), call=call, case=case, what="lse", diagnose=diagnose,
                 device=device, against="torch.logsumexp(q @ k.transpose(-2, -1) / sqrt(head_dim), -1)"
                 + (" over the keys the bottom-right causal mask allows" if causal else ""),
                 **tol, float32_inside=expect.float32_inside(kata, q.dtype))


# --- what recorded calls say about the tiles ------------------------------------------------------

def score_entries(ops, hd) -> int:
    return sum(math.prod(shape) for shape in score_tiles(ops, hd))


@recorded
def trusted_entries(fn, q, k, v, block_q, block_k, causal):
    """How many scores a trusted implementation computes on this call, from its recorded products."""
    ops = []
    with torch.no_grad(), _recorder()(ops):
        fn(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    return score_entries(ops, q.size(-1))


def recorded_call(learner, q, k, v, bq, bk, causal):
    """The learner's result and every torch function its call ran (after one unrecorded call on
    other inputs, so that lazy imports and memoised results cannot hide the ops)."""
    learner.flash_attention(torch.flip(q, dims=(-2,)), k, v, block_q=bq, block_k=bk, causal=causal)
    with learner.recording() as ops:
        result = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal)
    return result, ops


def count_diagnosis(bugs, kata, result, total, q, k, v, bq, bk, causal):
    """The known bug that computes this many scores and these values: a count alone could be a
    different mistake that happens to compute as many (a top-left causal mask, say)."""
    return lambda: bugs.match((result, total), lambda impl: (trusted(impl.flash_attention, q, k, v, bq, bk, causal),
                                                             trusted_entries(impl.flash_attention, q, k, v, bq, bk,
                                                                             causal)),
                              **kata.tolerance("float32"))


def tiles_needed(Tq, Tk, bq, bk):
    """Scores per (batch, head) of the tiles a causal run visits: for each query block, the key
    blocks up to the one holding its last query's position."""
    offset, total = Tk - Tq, 0
    for i0 in range(0, Tq, bq):
        i1 = min(i0 + bq, Tq)
        total += (i1 - i0) * min(-(-(offset + i1) // bk) * bk, Tk)
    return total


# --- checks --------------------------------------------------------------------------------------

def test_matches_sdpa(learner, bugs, kata, rng, device):
    """out equals F.scaled_dot_product_attention, for Tq = Tk, Tq < Tk and Tq > Tk, ragged tiles, float64 and float32"""
    cases = [(cfg, torch.float64) for cfg in SDPA_CASES] + [(SDPA_CASES[0], torch.float32)]
    for (B, H, Tq, Tk, hd, bq, bk), dtype in cases:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd, dtype)
        tol = kata.tolerance(dtype)
        call, case = call_text(bq, bk), case_text(B, H, Tq, Tk, hd, dtype)
        got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=False)
        judge_out(got, q, k, v, False, call=call, case=case, tol=tol, device=device, kata=kata,
                  diagnose=diagnose_with(bugs, kata, got, q, k, v, bq, bk, False))


def test_lse_matches_logsumexp(learner, bugs, kata, rng, device):
    """lse (B, H, Tq) equals torch.logsumexp of the scaled scores over each query's allowed keys, causal and not"""
    for (B, H, Tq, Tk, hd, bq, bk), causal in LSE_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        tol = kata.tolerance("float64")
        call, case = call_text(bq, bk, causal), case_text(B, H, Tq, Tk, hd)
        got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal)
        judge_lse(got, q, k, causal, call=call, case=case, tol=tol, device=device, kata=kata,
                  diagnose=diagnose_with(bugs, kata, got, q, k, v, bq, bk, causal))


def test_same_for_every_tile_size(learner, bugs, kata, rng, device):
    """the output is the same for every tile size: 1 x 1, ragged both ways, one tile as large as the sequences, tiles larger than them"""
    B, H, Tq, Tk, hd = TILE_SHAPE
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    tol = kata.tolerance("float64")
    for causal, sizes in ((False, TILE_SIZES), (True, CAUSAL_TILE_SIZES)):
        for bq, bk in sizes:
            call = call_text(bq, bk, causal)
            case = case_text(B, H, Tq, Tk, hd, about=f"the same q, k, v for every tile size of {sizes}")
            got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal)
            judge_out(got, q, k, v, causal, call=call, case=case, tol=tol, device=device, kata=kata,
                      diagnose=diagnose_with(bugs, kata, got, q, k, v, bq, bk, causal))


def huge_inputs(rng, kind, dtype):
    """q, k, v whose scaled scores reach about HUGE. "offset": k shares one large component, so each
    query's scores sit around its own offset of up to ±HUGE with an O(1) spread (a naive exp
    overflows, or underflows to 0/0, on a smooth softmax). "spread": q and k scaled up, so the
    scores within a row spread over thousands (a max taken from the first block only overflows)."""
    B, H, Tq, Tk, hd = HUGE_SHAPE[:5]
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    if kind == "offset":
        u = normal(rng, hd)
        k = k + (HUGE / 2 * math.sqrt(hd) / u.norm()) * u   # q_i·u / |u| ~ N(0, 1): row offsets of std HUGE / 2
    else:
        q, k = q * math.sqrt(HUGE / 3), k * math.sqrt(HUGE / 3)   # scores of std HUGE / 3
    return q.to(dtype), k.to(dtype), v.to(dtype)


def conditioning(q, k):
    """The largest sum of |q_d k_d| / sqrt(head_dim) of any (query, key): how far an honest
    rounding of a score may move it is a few ulps of this, not of the score."""
    return float((q.double().abs() @ k.double().abs().transpose(-2, -1)).amax()) / math.sqrt(q.size(-1))


def test_huge_logits_stay_finite(learner, bugs, kata, rng, device):
    """scores reaching ±1e4 (a naive exp overflows in float32 and float64): out and lse are finite and equal the float64 reference"""
    bq, bk = HUGE_SHAPE[5:]
    B, H, Tq, Tk, hd = HUGE_SHAPE[:5]
    for kind, dtype in (("offset", torch.float64), ("spread", torch.float64), ("offset", torch.float32)):
        q, k, v = huge_inputs(rng, kind, dtype)
        scores = conditioning(q, k)
        about = ("k shares one large component: each query's scores sit around its own offset, up to ±1e4, "
                 "spread over a few units" if kind == "offset" else "q and k scaled up: scores of std 3,333")
        call, case = call_text(bq, bk), case_text(B, H, Tq, Tk, hd, dtype, about)
        got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=False)
        # Rounding a score moves each weight by ulps of its conditioning, the output by that times |v|.
        out_tol = kata.tolerance(dtype, magnitude=scores * expect.magnitude(v))
        lse_tol = kata.tolerance(dtype, magnitude=scores)
        diagnose = diagnose_with(bugs, kata, got, q, k, v, bq, bk, False, scores * expect.magnitude(v))
        tensors(got, call=call, case=case, diagnose=diagnose)
        for what, value, shape in (("the output", got[0], (B, H, Tq, hd)), ("lse", got[1], (B, H, Tq))):
            expect.form(value, torch.Tensor, shape, dtype=dtype, device=device, call=call, case=case, what=what)
            bad = int((~torch.isfinite(value)).sum())
            expect.that(not bad, f"{sentence(what)} holds inf or NaN: exp of a score near 1e4 overflows "
                        "(or underflows to 0 / 0). Subtract the running max before exp, and keep lse as m + log(l).",
                        call=call, case=case, got=f"{bad} non-finite values of {value.numel()}",
                        expected="finite values", diagnose=diagnose)
        loose = kata.tolerance("float32", magnitude=scores * expect.magnitude(v))
        expect.array(got[0], sdpa(q, k, v, False), call=call, case=case, what="the output", diagnose=diagnose,
                     device=device, against="F.scaled_dot_product_attention in float64", **out_tol,
                     float32_inside=loose if dtype == torch.float64 else None)
        expect.array(got[1], logsumexp(q, k, False), call=call, case=case, what="lse", device=device,
                     against="torch.logsumexp of the scaled scores in float64", **lse_tol,
                     diagnose=diagnose_with(bugs, kata, got, q, k, v, bq, bk, False, scores),
                     float32_inside=kata.tolerance("float32", magnitude=scores) if dtype == torch.float64 else None)


def test_causal_matches(learner, bugs, kata, rng, device):
    """causal=True, bottom-right aligned, equals SDPA with that mask: aligned and ragged diagonal tiles, Tq < Tk, one query"""
    for B, H, Tq, Tk, hd, bq, bk in CAUSAL_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        tol = kata.tolerance("float64")
        about = f"query i sits at position {Tk - Tq} + i and sees keys 0 .. {Tk - Tq} + i" if Tq != Tk else ""
        call, case = call_text(bq, bk, True), case_text(B, H, Tq, Tk, hd, about=about)
        got = learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=True)
        judge_out(got, q, k, v, True, call=call, case=case, tol=tol, device=device, kata=kata,
                  diagnose=diagnose_with(bugs, kata, got, q, k, v, bq, bk, True))


def test_causal_skips_blocks_above_the_diagonal(learner, bugs, kata, rng, device):
    """causal runs compute the score tiles up to the diagonal and none above it (recorded matrix products)"""
    for B, H, Tq, Tk, hd, bq, bk in SKIP_CASES:
        q, k, v = inputs(rng, B, H, Tq, Tk, hd)
        call = call_text(bq, bk, True)
        case = case_text(B, H, Tq, Tk, hd, about="every torch call recorded; a score tile is a matrix product "
                         f"(@, matmul, bmm, einsum) that contracts head_dim = {hd}")
        result, ops = recorded_call(learner, q, k, v, bq, bk, True)
        total = score_entries(ops, hd)
        got = total / (B * H)   # scores per (batch, head)
        least, most = int(allowed_keys(Tq, Tk, True).sum()), tiles_needed(Tq, Tk, bq, bk)
        tile = bq * bk
        expect.that(total > 0, "No score tile was recorded: compute each tile's scores as a matrix product of a "
                    "block of queries and a block of keys.", call=call, case=case,
                    got="no recorded @, matmul, bmm or einsum contracts head_dim",
                    expected=f"{most:,} scores per (batch, head): {most / tile:g} tiles of {bq} x {bk}")
        diagnose = count_diagnosis(bugs, kata, result, total, q, k, v, bq, bk, True)
        expect.that(least <= got <= most, "The causal run does not compute exactly the tiles up to the diagonal: "
                    "a key block entirely after a query block's last position must be skipped, and the tiles that "
                    "cross the diagonal must be computed (and masked inside).", call=call, case=case,
                    got=f"{got:,g} scores per (batch, head) ({got / tile:g} tiles of {bq} x {bk})",
                    expected=f"{least:,} (the allowed (query, key) pairs) to {most:,} ({most / tile:g} tiles: "
                    f"for each query block, the key blocks up to its last query's position, {Tk - Tq} + its index)",
                    diagnose=diagnose)
    check_untampered(learner, call=call, case=case)


def test_never_builds_the_full_scores(learner, bugs, kata, rng, device):
    """no tensor with a Tq x Tk pair of axes (scores or mask) when the tiles are smaller: recorded shapes"""
    B, H, Tq, Tk, hd, bq, bk = FULL_SHAPE
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    for causal in (False, True):
        call = call_text(bq, bk, causal)
        case = case_text(B, H, Tq, Tk, hd, about="every torch call recorded, with the shapes of its tensors")
        result, ops = recorded_call(learner, q, k, v, bq, bk, causal)
        total = score_entries(ops, hd)
        computed = total / (B * H)
        need = int(allowed_keys(Tq, Tk, causal).sum())
        diagnose = count_diagnosis(bugs, kata, result, total, q, k, v, bq, bk, causal)
        expect.that(computed >= need, "Fewer scores were computed as matrix products than there are (query, key) "
                    "pairs to attend: compute each tile's scores with @, matmul, bmm or einsum, every tile a query "
                    "may see.", call=call, case=case,
                    got=f"{computed:,g} scores per (batch, head) from products contracting head_dim = {hd}",
                    expected=f"at least {need:,}", diagnose=diagnose)
        seen = [shape for op in ops for arg in [*op.get("args", []), *op.get("kwargs", {}).values()]
                for shape in shapes_in(arg)] + score_tiles(ops, hd)
        full = [shape for shape in seen if Tq in shape and Tk in shape]
        expect.that(not full, f"A tensor with a Tq x Tk = {Tq} x {Tk} pair of axes was built: the whole score matrix "
                    "(or a whole mask) is what tiling avoids. Work on (block_q, block_k) tiles and build each tile's "
                    "mask from positions.", call=call, case=case, got=f"a tensor of shape {full[0]}" if full else None,
                    expected=f"tiles of at most {bq} x {bk} scores; nothing with both a {Tq} and a {Tk} axis")
    check_untampered(learner, call=call, case=case)


def test_rejects_bad_arguments(learner, rng):
    """a block size below 1, and causal with Tq > Tk (queries without a key), raise ValueError or AssertionError"""
    B, H, hd = 2, 3, 8
    short, long = inputs(rng, B, H, 10, 12, hd), inputs(rng, B, H, 12, 10, hd)
    learner.flash_attention(*short, block_q=4, block_k=4, causal=True)   # valid calls first: only bad ones may raise
    learner.flash_attention(*long, block_q=4, block_k=4, causal=False)
    for (q, k, v), bq, bk, causal, why, hang in (
            (short, 0, 4, False, "block_q = 0: no tile has zero rows", "a loop that steps by block_q = 0 never moves on"),
            (short, 4, -4, False, "block_k = -4: a negative step would skip every key",
             "a loop that steps by block_k = -4 moves away from its end"),
            (long, 4, 4, True, "causal with Tq = 12 > Tk = 10: bottom-right aligned, queries 0 and 1 see no key", "")):
        call = call_text(bq, bk, causal)
        case = case_text(B, H, q.size(-2), k.size(-2), hd, about=why)
        wanted = "ValueError (or AssertionError) naming the bad argument"
        try:
            expect.refused(lambda: learner.flash_attention(q, k, v, block_q=bq, block_k=bk, causal=causal), call=call,
                           case=case, expected=wanted, returned="A bad argument was accepted.",
                           raised="A bad argument failed somewhere inside instead of being refused: check it yourself "
                                  "first.")
        except SandboxFailed as exc:
            # The valid calls above came back, so this call's timeout (or crash) is the bad argument's doing.
            raise CheckFailed("A bad argument was not refused, and the call never came back: check the arguments "
                              "before any loop runs and raise ValueError" + (f" ({hang})." if hang else "."),
                              call=call, case=case, got=exc.message, expected=wanted) from None


def test_banned_api(learner, kata, rng, device):
    """no SDPA, nn.MultiheadAttention, flex_attention or torch's fused attention kernels: the tiles written by hand"""
    B, H, Tq, Tk, hd, bq, bk = SDPA_CASES[0]
    q, k, v = inputs(rng, B, H, Tq, Tk, hd)
    call, case = call_text(bq, bk, True), case_text(B, H, Tq, Tk, hd)
    _, ops = recorded_call(learner, q, k, v, bq, bk, True)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The function uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="tiles of scores from matrix products, an online softmax by hand",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
