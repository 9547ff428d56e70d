"""Grader of the rope kata (katas/rope/README.md)."""
from math import prod

import torch

from graders.engine import expect
from graders.engine.learner import describe_value
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, listing, normal

# rope_cache cases (T, head_dim, base): 4 to 32 pairs, so i/hd against 2i/hd and a missing 1/
# show from pair 1 on; T != head_dim / 2. (1, 8) is position 0 alone, (4096, 64) phases up to 4095.
CACHE_CASES = [(64, 16, 10000.0), (10, 8, 500.0), (1, 8, 10000.0), (4096, 64, 10000.0)]
# apply_rope cases (B, H, T, head_dim, dtype, positions): H != T != head_dim. Positions are never
# 0..T-1, so code that reads rows 0..T-1 of the cache shows: an offset run, a shuffled scatter,
# large positions, and one with a repeat and a 0 (beam search puts two tokens at one position).
ROPE_CASES = [(2, 3, 6, 8, torch.float64, [5, 6, 7, 8, 9, 10]),
              (2, 2, 5, 16, torch.float64, [31, 2, 117, 64, 9]),
              (1, 3, 7, 12, torch.float64, [4093, 4000, 4001, 3077, 4094, 2048, 4095]),
              (2, 3, 5, 8, torch.float32, [4, 4, 0, 19, 2])]
# Module configs (B, T, d_model, n_heads): head_dim 8 and 16 (4 and 8 pairs), != n_heads != T.
CONFIGS = [(2, 7, 24, 3), (3, 6, 32, 2)]
# The bugs a decode check can name: their chunked run differs from their own forward over the whole
# sequence (a token rotated at its index in the chunk, not at past + index; a softmax over the
# queries, which each chunk takes over its own queries alone).
DECODE_CODES = ("rope-positions-ignored", "softmax-wrong-dim")
KEYS = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"]
CASE = ("x: {dtype} ({B}, {T}, {d}), standard normal; n_heads={H}, head_dim={hd}; weights injected "
        "(W ~ N(0, 1/{d}), no bias); {base}")
KIT_PAIRS = "pair i is (x[2i], x[2i+1]), turned by positions[t]·θ_i, θ_i = base^(-2i/head_dim)"


def base_text(base) -> str:
    return "base 10000 (the default)" if base is None else f"base {base:g}"


def shapes(d):
    return {name: [d, d] for name in KEYS}


def weights(rng, d):
    """A state_dict to inject. W ~ N(0, 1/d) keeps q, k, v at unit variance, so scores stay near
    unit variance too and every rotation bug moves the softmax visibly."""
    return {name: normal(rng, d, d, std=d ** -0.5) for name in KEYS}


def constructor(d, H, max_len=None, base=None) -> str:
    extra = ("" if max_len is None else f", max_len={max_len}") + ("" if base is None else f", base={base:g}")
    return f"RoPEAttention({d}, {H}{extra})"


def construct(learner, d, H, max_len=None, base=None):
    """The learner's module, given only the arguments the case names: the others keep their defaults."""
    kwargs = {k: v for k, v in (("max_len", max_len), ("base", base)) if v is not None}
    return learner.RoPEAttention(d, H, **kwargs)


def build(learner, device, sd, H, *, max_len=None, base=None):
    """The learner's module: constructed, its parameters checked, cast to the weights' dtype,
    moved, weights injected, eval mode. A parameter beside the injected ones costs the parameters
    check alone."""
    d = sd["q_proj.weight"].shape[0]
    return inject(learner, construct(learner, d, H, max_len, base), sd, device=device,
                  call=constructor(d, H, max_len, base),
                  problem="The module lacks the projections the grader injects its weights into.",
                  hint=" (nn.Linear(d_model, d_model, bias=False) each)")


@recorded
def trusted(cls, sd, H, x, *, max_len=None, base=None, splits=None):
    """(out, (k, v)) of a trusted module (the reference or a bug oracle) in float64 on the CPU:
    one forward over x, or with ``splits`` one forward per chunk of x, each given the cache the
    last one returned, the outputs concatenated."""
    d = x.shape[-1]
    kwargs = {k: v for k, v in (("max_len", max_len), ("base", base)) if v is not None}
    with torch.no_grad():
        m = cls(d, H, **kwargs).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()}, strict=False)
        xd, outs, kv, start = x.double(), [], None, 0
        for size in splits or [x.shape[1]]:
            out, kv = m(xd[:, start:start + size], past_kv=kv)
            outs.append(out)
            start += size
    return torch.cat(outs, dim=1).to(x.dtype), tuple(t.to(x.dtype) for t in kv)


def module_tolerance(kata, dtype, positions: int) -> tuple[dict, dict]:
    """(tol, float32-inside tol) of a module output: a cache computed in float32 is off by a few
    ulps of the largest position, which the float32 tolerance grows with."""
    loose = kata.tolerance("float32", magnitude=positions)
    return (kata.tolerance(dtype) if str(dtype).endswith("float64") else loose), loose


def float32_buffer(value, cast, tol) -> bool:
    """True when ``value`` is exactly (to ``tol``) what a module whose cos/sin buffer was built in
    float32 gives once the grader casts it to float64 (``cast``): the README's own hint builds the
    buffer with rope_cache's float32 default, and ``.to(float64)`` is the grader's, so such a module
    computes nothing in float32 and gets no float32-inside note. ``cast`` is None for float32 cases."""
    return cast is not None and expect.mismatch(value, cast, **tol) is None


def module_form(got, *, B, T, past, d, H, dtype, device, call, case):
    """forward returned (out (B, T, d), (k, v) (B, H, past + T, hd) each) of x's dtype on its device."""
    expect.that(type(got) is tuple and len(got) == 2 and type(got[1]) is tuple and len(got[1]) == 2,
                "forward must return (out, (k, v)).", call=call, case=case, got=describe_value(got),
                expected="tuple (out (B, T, d_model), (k, v)), k and v (B, n_heads, past + T, head_dim)")
    expect.form(got[0], torch.Tensor, (B, T, d), dtype=dtype, device=device, call=call, case=case, what="the output")
    for what, t in (("the cached k", got[1][0]), ("the cached v", got[1][1])):
        expect.form(t, torch.Tensor, (B, H, past + T, d // H), dtype=dtype, device=device, call=call, case=case,
                    what=what)


def pair_norms(t):
    """(..., hd/2): the length of each of the kit's pairs (t[2i], t[2i+1])."""
    t = t.detach().cpu().double()
    return (t[..., 0::2] ** 2 + t[..., 1::2] ** 2).sqrt()


def table(bugs, P, hd, base, dtype):
    """(cos, sin) of the reference for positions 0..P-1, the rows apply_rope is handed."""
    return bugs.reference.rope_cache(P, hd, base, dtype=dtype)


def half_cache_diagnosis(got, T, hd):
    """rope-half-vs-interleaved: (T, head_dim) tables whose two halves repeat, Hugging Face's
    cat((freqs, freqs), -1) layout of the angles."""
    if type(got) is not tuple or len(got) != 2:
        return None
    h = hd // 2
    halves = [type(t) is torch.Tensor and tuple(t.shape) == (T, hd) and torch.equal(t[:, :h], t[:, h:]) for t in got]
    return "rope-half-vs-interleaved" if all(halves) else None


def test_rope_cache_values(learner, bugs, kata):
    """rope_cache(T, head_dim, base) is (cos, sin), each (T, head_dim // 2): cos(p·θ_i) and sin(p·θ_i), θ_i = base^(-2i/head_dim)"""
    cases = [(T, hd, base, None) for T, hd, base in CACHE_CASES] + [(300, 32, 10000.0, torch.float64)]
    for T, hd, base, dtype in cases:
        want = dtype or torch.float32
        args = [T, hd] + ([] if base == 10000.0 else [base])
        kwargs = {} if dtype is None else {"dtype": dtype}
        call = f"rope_cache({', '.join(f'{a:g}' for a in args)}{', dtype=torch.float64' if dtype else ''})"
        case = (f"positions 0..{T - 1}, head_dim {hd}, base {base:g}: cos[p, i] = cos(p·θ_i), θ_i = "
                f"{base:g}^(-2i/{hd}); {str(want).removeprefix('torch.')}, phases up to {T - 1}")
        got = learner.rope_cache(*args, **kwargs)
        expected = bugs.reference.rope_cache(T, hd, base, dtype=want)
        # Each entry is the cos or sin of a phase up to T - 1, rounded: a few ulps of T - 1.
        tol = kata.tolerance(want, magnitude=T - 1)
        loose = kata.tolerance("float32", magnitude=T - 1)
        diagnose = lambda: (bugs.match(got, lambda impl: impl.rope_cache(T, hd, base, dtype=want), **loose)
                            or half_cache_diagnosis(got, T, hd))
        expect.that(type(got) is tuple and len(got) == 2, "rope_cache must return a pair (cos, sin).", call=call,
                    case=case, got=describe_value(got), expected=f"tuple (cos, sin), each ({T}, {hd // 2})")
        for what, value, reference in (("cos", got[0], expected[0]), ("sin", got[1], expected[1])):
            expect.array(value, reference, call=call, case=case, what=what, diagnose=diagnose,
                         against="the table computed in float64 and rounded once", **tol,
                         float32_inside=loose if want == torch.float64 else None)


def test_rejects_odd_head_dim(learner):
    """an odd head_dim raises ValueError (or AssertionError), in rope_cache and in RoPEAttention: RoPE turns pairs"""
    learner.rope_cache(4, 6)   # valid calls first: only an odd head_dim may raise
    learner.RoPEAttention(18, 3)
    wanted = "ValueError (or AssertionError) saying that head_dim must be even"
    for call, make in (("rope_cache(4, 7)", lambda: learner.rope_cache(4, 7)),
                       ("RoPEAttention(21, 3)", lambda: learner.RoPEAttention(21, 3))):
        case = "head_dim = 7: three pairs and one dimension left over"
        expect.refused(make, call=call, case=case, expected=wanted,
                       raised="An odd head_dim failed somewhere inside instead of being refused: check it yourself first.",
                       returned="An odd head_dim cannot be split into pairs, yet a result came back.")


def test_apply_rope_matches_at_arbitrary_positions(learner, bugs, kata, rng, device):
    """apply_rope(x, cos, sin, positions) turns pair (x[2i], x[2i+1]) of token t by positions[t]·θ_i: offset, shuffled, repeated and large positions"""
    for B, H, T, hd, dtype, pos in ROPE_CASES:
        base = 500.0 if hd == 16 else 10000.0
        P = max(pos) + 3   # rows past the last position: reading rows 0..T-1 or the table's end shows
        cos, sin = table(bugs, P, hd, base, dtype)
        x, positions = normal(rng, B, H, T, hd).to(dtype), torch.tensor(pos)
        call = "apply_rope(x, cos, sin, positions)"
        case = (f"x: {str(dtype).removeprefix('torch.')} ({B}, {H}, {T}, {hd}), standard normal; cos, sin = "
                f"rope_cache({P}, {hd}, {base:g}) of the reference; positions = {pos}; {KIT_PAIRS}")
        tol = kata.tolerance(dtype)
        got, (x_after, *_), _ = learner.apply_rope.echo(x, cos, sin, positions)
        # float64 on the same (float32-valued) inputs, rounded once: the best float32 answer there is.
        expected = bugs.reference.apply_rope(x.double(), cos.double(), sin.double(), positions).to(dtype)
        expect.array(got, expected, call=call, case=case,
                     what="the rotated x", device=device, **tol, float32_inside=expect.float32_inside(kata, dtype),
                     diagnose=lambda: bugs.match(got, lambda impl: impl.apply_rope(x, cos, sin, positions),
                                                 **kata.tolerance("float32")))
        expect.that(torch.equal(x_after.cpu(), x), "apply_rope changed its input x in place: the caller's q and k "
                    "are gone (and so would be a cache holding them).", call=call, case=case,
                    got="x changed after the call", expected="a new tensor returned, x unchanged")


def test_preserves_norms(learner, bugs, kata, case_rng, rng, device):
    """apply_rope keeps the length of every pair (x[2i], x[2i+1]) and moves them: a rotation of each pair"""
    # Only this property, on what your apply_rope answers: the angles are the value check's business.
    B, H, T, hd, base = 2, 3, 6, 16, 10000.0
    pos = [int(p) + 1 for p in case_rng.choice(399, size=T, replace=False)]
    cos, sin = table(bugs, 400, hd, base, torch.float64)
    x, positions = normal(rng, B, H, T, hd), torch.tensor(pos)
    call = "apply_rope(x, cos, sin, positions)"
    case = (f"x: float64 ({B}, {H}, {T}, {hd}), standard normal; cos, sin = rope_cache(400, {hd}) of the "
            f"reference; positions = {pos}")
    got = learner.apply_rope(x, cos, sin, positions)
    expect.form(got, torch.Tensor, (B, H, T, hd), dtype=torch.float64, device=device, call=call, case=case,
                what="the rotated x")
    diagnose = lambda: bugs.match(got, lambda impl: impl.apply_rope(x, cos, sin, positions),
                                  **kata.tolerance("float32"))
    # |pair| is a square root of two squares of O(1) values: float64 keeps it to 1e-15.
    expect.values(pair_norms(got), pair_norms(x), call=call, case=case, what="the length of each pair (x[2i], x[2i+1])",
                  against="the lengths before the rotation", **kata.tolerance("float64"), diagnose=diagnose,
                  float32_inside=expect.float32_inside(kata))
    moved = expect.mismatch(got, x, **kata.tolerance("float32"))
    expect.that(moved is not None, "apply_rope returned x unchanged: at positions 1 to 399 every pair must turn.",
                call=call, case=case, got="the rotated x equals x",
                expected="pair i of token t turned by positions[t]·θ_i",
                diagnose=diagnose)


def test_dot_product_depends_on_offset(learner, bugs, kata, rng, device):
    """with your apply_rope, q at position m and k at position n have a dot product that depends on m − n only"""
    # Only this property, on what your apply_rope answers for one q and one k placed at many positions.
    B, H, hd, base = 2, 2, 16, 10000.0
    starts, offsets = [0, 5, 37, 300, 2500], [0, 1, 3, 10, 50]
    m_pos = torch.tensor([a + r for a in starts for r in offsets])   # query at m = a + r
    n_pos = torch.tensor([a for a in starts for _ in offsets])        # key at n = a: m - n = r
    N, P = len(m_pos), max(starts) + max(offsets) + 1
    cos, sin = table(bugs, P, hd, base, torch.float64)
    q0, k0 = normal(rng, B, H, 1, hd), normal(rng, B, H, 1, hd)
    q, k = q0.expand(B, H, N, hd).contiguous(), k0.expand(B, H, N, hd).contiguous()
    call = "apply_rope(q, cos, sin, m) · apply_rope(k, cos, sin, n)"
    case = (f"one q and one k, float64 (B={B}, H={H}, head_dim={hd}), standard normal, repeated at queries m = "
            f"a + r and keys n = a for a in {starts}, r = m - n in {offsets}; cos, sin = rope_cache({P}, {hd})")
    got_q, got_k = learner.apply_rope(q, cos, sin, m_pos), learner.apply_rope(k, cos, sin, n_pos)
    for what, t in (("the rotated q", got_q), ("the rotated k", got_k)):
        expect.form(t, torch.Tensor, (B, H, N, hd), dtype=torch.float64, device=device, call=call, case=case, what=what)
    dots = (got_q.cpu() * got_k.cpu()).sum(-1).view(B, H, len(starts), len(offsets))   # (B, H, a, r)

    def diagnose():
        compute = lambda impl: (impl.apply_rope(q, cos, sin, m_pos), impl.apply_rope(k, cos, sin, n_pos))
        return bugs.match((got_q, got_k), compute, **kata.tolerance("float32"))

    # A dot product sums head_dim products, each off by a few ulps of |q_j|·|k_j| when computed in float32.
    loose = kata.tolerance("float32", magnitude=float((q0.abs() * k0.abs()).sum(-1).max()))
    flat = expect.mismatch(dots[..., 0, :], dots[..., 0, :1].expand(B, H, len(offsets)), **loose)
    expect.that(flat is not None, "q·k is the same at every offset m − n: the rotation does not depend on the "
                "positions you were given.", call=call, case=case,
                got=f"q·k = {dots[0, 0, 0, 0].item():.6g} for every m - n in {offsets}",
                expected="dot products that change with m − n", diagnose=diagnose)
    curve = dots[..., :1, :].expand_as(dots)   # q·k at a = 0, for each offset
    problem = expect.mismatch(dots, curve, **kata.tolerance("float64"))
    if problem is not None and expect.mismatch(dots, curve, **loose) is None:
        expect.note(expect.FLOAT32_INSIDE, "q·k depends on m − n only to float32 rounding: your apply_rope computes "
                    "in float32 inside, which this check accepts.")
        problem = None
    if problem is not None:
        spread = (dots - curve).abs().amax(dim=(0, 1))   # (a, r)
        a, r = divmod(int(spread.argmax()), len(offsets))
        expect.fail("q·k changes with where the pair sits, not only with m − n: your rotation is not the same "
                    "turn for every position.", call=call, case=case,
                    got=f"m - n = {offsets[r]}: q·k = {dots[0, 0, 0, r].item():.6g} at n = 0, "
                        f"{dots[0, 0, a, r].item():.6g} at n = {starts[a]} ({problem})",
                    expected="the same q·k for every n at a given m − n (R_mᵀR_n = R_(n−m))", diagnose=diagnose)


def test_parameters(learner):
    """the parameters are exactly q_proj, k_proj, v_proj and o_proj, bias-free d_model x d_model: RoPE learns nothing"""
    for d, H in ((24, 3), (32, 2)):
        m = learner.RoPEAttention(d, H)
        info = learner.module_info(m)
        params = {name: entry[0] for name, entry in info["parameters"].items()}
        count = sum(prod(s) for s in params.values())
        expect.that(params == shapes(d), "The module's parameters are not the kata's.",
                    call=f"RoPEAttention({d}, {H}).named_parameters()", got=f"{listing(params)}: {count:,} in all",
                    expected=f"{listing(shapes(d))}: 4·{d}² = {4 * d * d:,}. The rotation angles are fixed, "
                    "not learned: keep cos and sin in buffers (register_buffer), not nn.Parameter")
        missing = [k for k in KEYS if k not in info["state_dict"]]
        expect.that(not missing, "Some parameters are missing from state_dict, so a saved model would lose them.",
                    call=f"RoPEAttention({d}, {H}).state_dict().keys()", got=", ".join(info["state_dict"]) or "no keys",
                    expected=", ".join(KEYS) + ", and any persistent buffers you register")
    check_untampered(learner, call=f"RoPEAttention({d}, {H}).named_parameters()")


def compare(learner, bugs, kata, device, sd, H, x, *, base=None, max_len=None, dtype=torch.float64):
    """Build the learner's module with sd, run x through it without a cache and judge the output
    against the independent oracle and the reference, then the cached (k, v) against the reference."""
    B, T, d = x.shape
    tol, loose = module_tolerance(kata, dtype, T)
    m = build(learner, device, sd, H, max_len=max_len, base=base)
    call = f"{constructor(d, H, max_len, base)}(x)"
    case = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, T=T, d=d, H=H, hd=d // H, base=base_text(base)) \
        + "; eval mode; positions 0..T-1"
    got = m(x)
    module_form(got, B=B, T=T, past=0, d=d, H=H, dtype=dtype, device=device, call=call, case=case)
    compute = lambda impl: trusted(impl.RoPEAttention, sd, H, x, max_len=max_len, base=base)
    diagnose = lambda: (bugs.match(got, compute, **loose) or bugs.match(got[0], lambda impl: compute(impl)[0], **loose))
    inside = loose if dtype == torch.float64 else None
    # float64 cases: what a float32 cos/sin buffer cast by the grader gives, passed without a note.
    cast_out, cast_k = ((bugs.expected.sdpa_rope(sd, H, x, base, torch.float32),
                         bugs.expected.keys(sd, H, x, base, torch.float32)) if dtype == torch.float64 else (None, None))
    if not float32_buffer(got[0], cast_out, tol):
        expect.array(got[0], bugs.expected.sdpa_rope(sd, H, x, base), call=call, case=case, what="the output",
                     diagnose=diagnose, device=device, against="complex-number rotations of q and k, then "
                     "F.scaled_dot_product_attention(is_causal=True), with the same weights", **tol,
                     float32_inside=inside)
    expected = trusted(bugs.reference.RoPEAttention, sd, H, x, max_len=max_len, base=base)
    for what, value, want, cast in (("the output", got[0], expected[0], cast_out),
                                    ("the cached k", got[1][0], expected[1][0], cast_k),
                                    ("the cached v", got[1][1], expected[1][1], None)):
        if not float32_buffer(value, cast, tol):
            expect.array(value, want, call=call, case=case, what=what, diagnose=diagnose, device=device, **tol,
                         float32_inside=inside)


def test_matches_reference(learner, bugs, kata, rng, device):
    """with injected weights, the causal output equals RoPE-rotated q and k through SDPA, and (k, v) are the reference's"""
    for (B, T, d, H), base, max_len, dtype in ((CONFIGS[0], None, None, torch.float64),
                                               (CONFIGS[1], 100.0, 16, torch.float64),
                                               (CONFIGS[0], None, None, torch.float32)):
        sd = {k: v.to(dtype) for k, v in weights(rng, d).items()}
        compare(learner, bugs, kata, device, sd, H, normal(rng, B, T, d).to(dtype), base=base, max_len=max_len,
                dtype=dtype)


def test_rotates_q_and_k_only(learner, bugs, kata, rng, device):
    """the cached values are v_proj(x) unrotated and the keys rotated (norms kept, position 0 unturned); with q_proj = 0 the output is the causal mean of the values"""
    B, T, d, H = CONFIGS[0]
    hd = d // H
    tol, loose = module_tolerance(kata, torch.float64, T)
    sd, x = weights(rng, d), normal(rng, B, T, d)
    # q = 0 makes every score 0: each query averages the values of keys 0..i, whatever the keys are.
    blind = {**sd, "q_proj.weight": torch.zeros(d, d, dtype=torch.float64)}
    for weights_, about in ((sd, ""), (blind, "; q_proj.weight = 0, so every allowed score is 0")):
        call = f"{constructor(d, H)}(x)"
        case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, hd=hd, base=base_text(None)) + about + "; eval mode"
        got = build(learner, device, weights_, H)(x)
        module_form(got, B=B, T=T, past=0, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)
        compute = lambda impl: trusted(impl.RoPEAttention, weights_, H, x)
        diagnose = lambda: (bugs.match(got, compute, **loose)
                            or bugs.match(got[0], lambda impl: compute(impl)[0], **loose))
        if not about:
            expect.values(got[1][1], bugs.expected.values(weights_, H, x), call=call, case=case, what="the cached v",
                          against="v_proj(x) split into heads, not rotated: values carry content, not position",
                          **tol, float32_inside=loose, diagnose=diagnose)
            # Judged by what makes it a rotation, whatever the pairing and frequencies (matches-reference
            # judges those): each token keeps its norm, and the token at position 0 turns by angle 0.
            raw, k = bugs.expected.heads(weights_, "k_proj.weight", H, x), got[1][0]   # (B, H, T, hd) each
            expect.values(k.norm(dim=-1), raw.norm(dim=-1), call=call, case=case, what="the norm of each cached key",
                          against="the norm of k_proj(x) split into heads: a rotation keeps every vector's length",
                          **tol, float32_inside=loose, diagnose=diagnose)
            expect.values(k[:, :, 0], raw[:, :, 0], call=call, case=case, what="the cached k at position 0",
                          against="k_proj(x) split into heads: position 0 turns by angle 0", **tol,
                          float32_inside=loose, diagnose=diagnose)
            expect.that(expect.mismatch(k[:, :, 1:], raw[:, :, 1:], **loose) is not None,
                        f"The cached k is not rotated: at positions 1 to {T - 1} every key must turn.", call=call,
                        case=case, got="the cached k equals k_proj(x) split into heads",
                        expected="k_proj(x) split into heads, pair i of token t turned by t·θ_i", diagnose=diagnose)
            continue
        expect.values(got[0], bugs.expected.causal_mean(weights_, H, x), call=call, case=case, what="the output",
                      against="o_proj of the mean of the unrotated values of keys 0..i", **tol,
                      float32_inside=loose, diagnose=diagnose)


def decode(learner, bugs, kata, device, sd, H, x, splits):
    """Run x through the learner's module in chunks of ``splits`` tokens, each call given the
    (k, v) the last one returned, and judge the outputs against the same module's own forward over
    the whole sequence: only the cache is judged here, whatever the module's rotation (the value
    checks judge that against the reference)."""
    B, T, d = x.shape
    tol, loose = module_tolerance(kata, torch.float64, T)
    m = build(learner, device, sd, H)
    case = (CASE.format(dtype="float64", B=B, T=T, d=d, H=H, hd=d // H, base=base_text(None))
            + f"; eval mode; x fed in chunks of {splits} tokens, each call given the (k, v) the last one returned")
    full_call = f"{constructor(d, H)}(x)"
    full = m(x)   # the module's own answer without a cache: what decoding must reproduce
    module_form(full, B=B, T=T, past=0, d=d, H=H, dtype=torch.float64, device=device, call=full_call, case=case)
    outs, kv, start = [], None, 0
    for size in splits:
        call = (f"{constructor(d, H)}(x[:, {start}:{start + size}]"
                + ("" if kv is None else f", past_kv=<(k, v) of positions 0..{start - 1}>") + ")")
        got = m(x[:, start:start + size]) if kv is None else m(x[:, start:start + size], past_kv=kv)
        module_form(got, B=B, T=size, past=start, d=d, H=H, dtype=torch.float64, device=device, call=call, case=case)
        outs.append(got[0])
        kv, start = got[1], start + size
    out = torch.cat(outs, dim=1)
    call = f"{constructor(d, H)}: chunks {splits}, outputs concatenated, against {full_call}"
    # Only a bug whose own chunks differ from its own full forward can be why this failed: a module
    # that decodes consistently with another rotation passes here and is named where it is judged.
    diagnose = lambda: bugs.match((out, kv), lambda impl: trusted(impl.RoPEAttention, sd, H, x, splits=splits),
                                  among=DECODE_CODES, **loose)
    for what, value, want in (("the outputs of the chunks, concatenated,", out, full[0]),
                              ("the cached k after the last chunk", kv[0], full[1][0]),
                              ("the cached v after the last chunk", kv[1], full[1][1])):
        expect.values(value, want, call=call, case=case, what=what, diagnose=diagnose, **tol, float32_inside=loose,
                      against="your module's own forward over the whole sequence: chunk tokens sit at past .. "
                              "past + T - 1, and query i of a chunk sees keys 0..past + i")


def test_decode_with_cache_equals_full(learner, bugs, kata, rng, device):
    """prefill, then decoding token by token (and a chunk of two) with past_kv, equals your module's own forward over the whole sequence"""
    B, T, d, H = 2, 9, 24, 3
    decode(learner, bugs, kata, device, weights(rng, d), H, normal(rng, B, T, d), [4, 1, 2, 1, 1])


def test_banned_api(learner, kata, rng, device):
    """no SDPA or nn.MultiheadAttention: attention written by hand"""
    B, T, d, H = CONFIGS[0]
    call = f"{constructor(d, H)}(x)"
    case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, hd=d // H, base=base_text(None)) + "; eval mode"
    m = build(learner, device, weights(rng, d), H)
    m(normal(rng, B, T, d))   # first call: lets lazy imports happen before recording
    x = normal(rng, B, T, d)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:
        m(x)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The module uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="attention written with matmul, masked_fill and softmax",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
