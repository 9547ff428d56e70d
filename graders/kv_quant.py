"""Grader of the kv-quant kata (katas/kv-quant/README.md)."""
import numpy as np
import torch

from graders.engine import expect
from graders.engine.recording import recorded

INT8, E4M3 = torch.int8, torch.float8_e4m3fn
QMAX = {INT8: 127.0, E4M3: 448.0}
AXES = ("batch", "head", "position", "channel")

# quantize's cases: (dtype, shape, axis). Keys' axis -2 and values' -1, a 2-D x and a 3-D x whose
# axis is neither, so a quantize that ignores `axis` answers a scale of the wrong shape.
ROUNDTRIP = {INT8: [((2, 3, 6, 5), -2), ((2, 3, 6, 5), -1), ((3, 8, 4), 1)],
             E4M3: [((2, 3, 6, 5), -2), ((2, 3, 6, 5), -1), ((4, 7), 0)]}
# The caches the attention checks fill: (dtype, B, H, d, ops), an op ("append", T) or ("attend", Tq).
# Each ends on a chunk of Tq > 1 queries after cached tokens (its causal mask must be aligned
# bottom-right) or on one decoded token; H != d, so a softmax or a scale over the wrong axis shows.
SCHEDULES = [(INT8, 2, 3, 8, [("append", 6), ("append", 3), ("attend", 3), ("append", 1), ("attend", 1)]),
             (E4M3, 1, 2, 6, [("append", 5), ("attend", 5), ("append", 2), ("attend", 2), ("append", 1), ("attend", 1)])]
# The outlier case: key channel 3 and value token 2 twenty times the rest (KIVI found a few key
# channels standing out in the models it studied, and none in the values).
OUTLIER = {"B": 2, "H": 2, "d": 8, "T": 8, "Tq": 2, "channel": 3, "token": 2, "factor": 20.0}
# The memory check's cache: 8 chunks of 256 tokens of 4 heads of 64 channels, batch 1. Chunks of
# 256 tokens keep each append's float32 temporaries (256 KiB) small beside what is measured: with
# 512 the allocator's leftovers moved a correct cache's memory by up to 0.3 MiB between seeds.
MEMORY = {"H": 4, "d": 64, "chunks": (256,) * 8}


def drawn(rng, *shape, std=1.0) -> torch.Tensor:
    """float32 N(0, std²) draws: the kata's caches hold float32 keys and values."""
    return torch.from_numpy((rng.standard_normal(shape) * std).astype(np.float32))


def absmax_scale(x, dtype, axis):
    """absmax / qmax over ``axis``, float64: where x / scale lands, for moving it off the ties."""
    absmax = x.double().abs().amax(dim=axis, keepdim=True)
    return torch.where(absmax > 0, absmax / QMAX[dtype], torch.ones_like(absmax))


def off_ties(x, scale):
    """x moved so that x / scale lies at least 0.1 from every integer and half-integer (the
    slice's absmax stays where it is): a right rounding computed in another order (x * (1/scale),
    float64) and a truncation then give one answer, at every seed."""
    u = x.double() / scale
    n = torch.floor(u)
    f = u - n
    f = torch.where(f < 0.5, 0.1 + 0.6 * f, 0.6 + 0.6 * (f - 0.5))   # [0.1, 0.4) and [0.6, 0.9)
    u = torch.where(u.abs() > 126.99, u, n + f)   # the absmax (|u| = 127) sets the scale: kept
    return (u * scale).float()


def keys_values(rng, B, H, T, d, dtype):
    """A chunk of keys and values, (B, H, T, d) each, off the ties of their own scales (per
    channel for keys, per token for values)."""
    k, v = drawn(rng, B, H, T, d), drawn(rng, B, H, T, d)
    return off_ties(k, absmax_scale(k, dtype, -2)), off_ties(v, absmax_scale(v, dtype, -1))


@recorded
def replay(cache_cls, dtype, ops):
    """What a trusted cache (the reference's or a bug's) answers to ``ops`` in order: each
    ("attend", q) its output; ("append", k, v) nothing."""
    cache, outs = cache_cls(dtype), []
    for op in ops:
        if op[0] == "append":
            cache.append(op[1], op[2])
        else:
            outs.append(cache.attend(op[1]))
    return outs


def fill(rng, dtype, B, H, d, schedule):
    """The ops of a schedule, with drawn keys, values and queries."""
    ops = []
    for what, T in schedule:
        ops.append(("append", *keys_values(rng, B, H, T, d, dtype)) if what == "append"
                   else ("attend", drawn(rng, B, H, T, d)))
    return ops


def ops_text(ops) -> str:
    """``append 6, append 3, attend 3``: what the grader's cache went through."""
    return ", ".join(f"{op[0]} {op[1].shape[2]}" for op in ops)


def judge_cache(learner, bugs, kata, dtype, ops, case):
    """Every attend of the learner's cache on ``ops`` equals the reference's, to float32's tolerance."""
    cache = learner.QuantKVCache(dtype)
    expected = replay(bugs.reference.QuantKVCache, dtype, ops)
    tol = kata.tolerance("float32")
    n = 0
    for i, op in enumerate(ops):
        if op[0] == "append":
            cache.append(op[1], op[2])
            continue
        call = f"cache.attend(q) with q {tuple(op[1].shape)}, after {ops_text(ops[:i])}"
        got = cache.attend(op[1])
        expect.array(got, expected[n], call=call, case=case, **tol, axes=AXES,
                     diagnose=lambda n=n, got=got: bugs.match(got, lambda impl: replay(impl.QuantKVCache, dtype, ops)[n], **tol))
        n += 1


def pair(result, call, case):
    """quantize's answer is a pair (q, scale)."""
    expect.that(isinstance(result, tuple) and len(result) == 2, "quantize must return a pair (q, scale).",
                call=call, case=case, got=type(result).__name__, expected="a tuple (q, scale)")
    return result


def judge_dequantize(learner, bugs, kata, codes, scale):
    """dequantize(codes, scale) equals the reference's: q * scale in float32."""
    tol = kata.tolerance("float32")
    call = f"dequantize(q, scale) with q {codes.dtype} {tuple(codes.shape)}, scale float32 {tuple(scale.shape)}"
    expect.array(learner.dequantize(codes, scale), bugs.reference.dequantize(codes, scale), call=call, **tol,
                 case="codes the same at every seed, scales drawn")


def judge_quantize(learner, bugs, dtype, x, axis, bound, case):
    """quantize(x, dtype, axis): q in dtype of x's shape, the reference's scale, and q * scale
    within ``bound`` (a tensor of x's shape) of x. The codes stay here: what they are depends on
    the draw, and the learner's code is sent nothing that does but values."""
    call = f"quantize(x, {dtype}, axis={axis})"
    q, scale = pair(learner.quantize(x, dtype, axis), call, case)
    ref_scale = bugs.reference.quantize(x, dtype, axis)[1]
    expect.form(q, torch.Tensor, tuple(x.shape), dtype=dtype, call=call, case=case, what="q")
    # absmax / qmax is one division: any order of computing it is within an ulp.
    expect.array(scale, ref_scale, call=call, case=case, rtol=1e-6, atol=0.0, what="scale",
                 diagnose=lambda: bugs.match(scale, lambda impl: impl.quantize(x, dtype, axis)[1], rtol=1e-6, atol=0.0))
    deq = q.float() * scale   # what the reference's dequantize makes of your q and scale
    call = f"{call}, then q.float() * scale"
    err = (deq.double() - x.double()).abs()
    worst = int(torch.argmax(err - bound))
    expect.that(bool((err <= bound).all()), "q * scale is further from x than the rounding allows.",
                call=call, case=case,
                got=f"an error of {float(err.flatten()[worst]):.4g} at x = {float(x.flatten()[worst]):.4g}",
                expected=f"at most {float(bound.flatten()[worst]):.4g} there",
                diagnose=lambda: bugs.match(deq, lambda impl: impl.dequantize(*impl.quantize(x, dtype, axis)),
                                            rtol=1e-6, atol=0.0))


def test_int8_roundtrip(learner, bugs, kata, case_rng, rng):
    """int8: dequantize is q * scale; the scale is absmax / 127 along the axis, and q * scale is within half a step (scale / 2) of x"""
    codes = torch.from_numpy(case_rng.integers(-127, 128, size=(2, 3, 4))).to(INT8)
    judge_dequantize(learner, bugs, kata, codes, drawn(rng, 2, 3, 1).abs() + 0.01)
    for shape, axis in ROUNDTRIP[INT8]:
        x = drawn(rng, *shape)
        scale = absmax_scale(x, INT8, axis)
        x = off_ties(x, scale)
        # round to nearest: |x / scale - q| <= 1/2; float32 products add ~1e-5 of a step at 127 steps.
        bound = scale * (0.5 + 1e-5)
        judge_quantize(learner, bugs, INT8, x, axis, bound.expand(x.shape),
                       f"x: float32 {shape}, standard normal; a scale per slice along axis {axis}")


def test_float8_roundtrip(learner, bugs, kata, case_rng, rng):
    """float8 e4m3: dequantize is q * scale; the scale is absmax / 448 along the axis, and q * scale is within half an ulp of e4m3 (2^-4 relative) of x, or half its smallest step (2^-10 scale) near 0"""
    codes = torch.from_numpy(case_rng.uniform(-448, 448, size=(2, 3, 4)).astype(np.float32)).to(E4M3)
    judge_dequantize(learner, bugs, kata, codes, drawn(rng, 2, 3, 1).abs() + 0.01)
    for shape, axis in ROUNDTRIP[E4M3]:
        x = drawn(rng, *shape)
        scale = absmax_scale(x, E4M3, axis)
        # 3 mantissa bits: a normal e4m3 value is within 2^-4 of itself relative; below 2^-6 the
        # subnormals are 2^-9 apart, half a step 2^-10. float32 adds ~1e-7 relative.
        bound = x.double().abs() * (2.0 ** -4 + 1e-6) + scale * (2.0 ** -10 + 1e-6)
        judge_quantize(learner, bugs, E4M3, x, axis, bound,
                       f"x: float32 {shape}, standard normal; a scale per slice along axis {axis}")


def test_static_scale_saturates(learner, bugs, kata, rng):
    """with a static scale, values past the range saturate: int8 to ±127, e4m3 to ±448 (never wrapped around, never NaN)"""
    tol = kata.tolerance("float32")
    for dtype, static in ((INT8, 0.01), (E4M3, 0.002)):
        scale = torch.full((1,), static, dtype=torch.float32)
        x = off_ties(drawn(rng, 2, 3, 4, 8, std=2.0), scale.double())
        call = f"quantize(x, {dtype}, scale=torch.tensor([{static}]))"
        case = (f"x: float32 (2, 3, 4, 8), std 2: up to ~{8 / static:,.0f} steps of the static scale, "
                f"past the {QMAX[dtype]:g} that {dtype} holds")
        q, got_scale = pair(learner.quantize(x, dtype, scale=scale), call, case)
        expect.form(q, torch.Tensor, tuple(x.shape), dtype=dtype, call=call, case=case, what="q")
        expect.array(got_scale, scale, call=call, case=case, rtol=0.0, atol=0.0, what="scale",
                     against="the static scale given")
        deq = q.float() * got_scale   # what the reference's dequantize makes of them
        expected = bugs.reference.dequantize(*bugs.reference.quantize(x, dtype, scale=scale))
        expect.array(deq, expected, call=f"{call}, then q.float() * scale", case=case, **tol, axes=AXES,
                     diagnose=lambda: bugs.match(deq, lambda impl: impl.dequantize(*impl.quantize(x, dtype, scale=scale)),
                                                 **tol))


def test_zero_slice(learner, rng):
    """an all-zero channel or token gets a positive, finite scale: no 0 / 0, its values come back as exact zeros"""
    x = drawn(rng, 2, 3, 6, 4)
    x[0, 1, :, 2] = 0.0   # an all-zero channel: its slice along axis -2
    x[1, 2, 3, :] = 0.0   # an all-zero token: its slice along axis -1
    zero = x == 0
    case = "x: float32 (2, 3, 6, 4), standard normal, but channel x[0, 1, :, 2] and token x[1, 2, 3, :] all zero"
    for dtype in (INT8, E4M3):
        for axis in (-2, -1):
            call = f"quantize(x, {dtype}, axis={axis})"
            q, scale = pair(learner.quantize(x, dtype, axis), call, case)
            expect.form(q, torch.Tensor, tuple(x.shape), dtype=dtype, call=call, case=case, what="q")
            expect.form(scale, torch.Tensor, tuple(s if i != x.dim() + axis else 1 for i, s in enumerate(x.shape)),
                        dtype=torch.float32, call=call, case=case, what="scale")
            bad = scale[~(torch.isfinite(scale) & (scale > 0))]
            expect.that(bad.numel() == 0, "A scale is 0 or not finite: the all-zero slice divides 0 by 0.",
                        call=call, case=case, got=f"scale {float(bad[0]) if bad.numel() else 0}",
                        expected="a positive, finite scale (1.0, or a floor such as 1 / (448 · 512))",
                        diagnose=lambda: "zero-scale")
            deq = q.float() * scale   # what the reference's dequantize makes of them
            lost = deq[~torch.isfinite(deq) | (zero & (deq != 0))]
            expect.that(lost.numel() == 0, "A zero does not come back as 0, or a value comes back NaN.",
                        call=f"{call}, then q.float() * scale", case=case,
                        got=f"{float(lost[0]) if lost.numel() else 0}", expected="0.0 where x is 0, finite elsewhere",
                        diagnose=lambda: "zero-scale")


def test_attend_matches(learner, bugs, kata, rng):
    """cache.attend(q) equals the reference on int8 and e4m3 caches filled in chunks: causal, bottom-right, dequantized and accumulated in float32"""
    for dtype, B, H, d, schedule in SCHEDULES:
        ops = fill(rng, dtype, B, H, d, schedule)
        judge_cache(learner, bugs, kata, dtype, ops,
                    f"QuantKVCache({dtype}); keys, values, queries float32 (B, H, T, d) = ({B}, {H}, T, {d}), "
                    f"standard normal; {ops_text(ops)}")


def test_outlier_channel(learner, bugs, kata, rng):
    """keys get a scale per channel and values a scale per token: a key channel and a value token twenty times larger leave the other channels and tokens their precision"""
    o = OUTLIER
    k, v = drawn(rng, o["B"], o["H"], o["T"], o["d"]), drawn(rng, o["B"], o["H"], o["T"], o["d"])
    k[..., o["channel"]] *= o["factor"]
    v[..., o["token"], :] *= o["factor"]
    k, v = off_ties(k, absmax_scale(k, INT8, -2)), off_ties(v, absmax_scale(v, INT8, -1))
    ops = [("append", k, v), ("attend", drawn(rng, o["B"], o["H"], o["Tq"], o["d"]))]
    judge_cache(learner, bugs, kata, INT8, ops,
                f"QuantKVCache(torch.int8); keys, values float32 ({o['B']}, {o['H']}, {o['T']}, {o['d']}), standard "
                f"normal, but key channel {o['channel']} and value token {o['token']} times {o['factor']:g}; "
                f"{ops_text(ops)}")


def test_cache_bytes(learner, rng):
    """the cache holds one byte an element and its scales: after 2,048 tokens its memory, as the kernel counts it, grows by at most twice the int8 codes, the scales and 512 KiB, not by float copies"""
    m = MEMORY
    H, d = m["H"], m["d"]
    chunks = [keys_values(rng, 1, H, T, d, INT8) for T in m["chunks"]]
    n = sum(m["chunks"])
    codes = 2 * H * n * d   # K and V, one byte an element
    scales = 4 * (H * d * len(chunks) + H * n)   # float32: a key scale per channel per chunk, a value scale per token
    case = (f"QuantKVCache(torch.int8); {len(chunks)} appends of {m['chunks'][0]} tokens, keys and values float32 "
            f"(1, {H}, T, {d}): {n:,} tokens, {codes:,} bytes of int8 codes and {scales:,} bytes of scales")

    def streamed():
        cache = learner.QuantKVCache(INT8)
        for k, v in chunks:
            cache.append(k, v)
        return cache

    # A first cache runs every code path once, so that the sandbox's memory grows, over a second, by
    # what the second holds, wherever it holds it.
    caches = [streamed()]   # held, both: no cache is freed before the memory is read
    before = learner.resident_bytes()
    caches.append(streamed())
    after = learner.resident_bytes()
    grown = None if None in (before, after) else after - before
    # Twice the codes, the scales, and 512 KiB for the interpreter's own allocations. The allocator
    # keeps some of each append's freed temporaries: the reference grows by 1.07 to 1.09 MiB, but a
    # right cache that clamps its int8 codes after the cast (one more temporary) grew by 1.02 to
    # 2.02 bytes an element over five gradings, at one seed. float32 copies of the keys alone add
    # 2 MiB here (3.1 bytes an element in all), of both 4 MiB.
    limit = 2 * codes + scales + (512 << 10)
    expect.that(grown is None or grown <= limit, f"After {n:,} tokens, the sandbox holds more memory than the "
                "quantized cache: something keeps more than one byte an element (float copies of the keys and values, "
                "or the dequantized cache).", call="resident memory of the sandbox, as the kernel counts it",
                case=case + "; the same appends once more, into a second cache",
                got="" if grown is None else f"{grown:,} bytes more after the second cache "
                f"({grown / (2 * H * n * d):.2f} bytes an element)",
                expected=f"at most {limit:,} bytes (twice the codes, the scales, and 512 KiB)",
                diagnose=lambda: "keeps-float-copy")
