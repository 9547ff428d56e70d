"""Grader of the linear-attention kata (katas/linear-attention/README.md)."""
import torch

from graders.engine import expect
from graders.engine.learner import describe_value
from graders.engine.products import float_shapes, product
from graders.engine.recording import recorded
from graders.engine.structure import check_untampered
from graders.engine.weights import normal

B, H, D, DV = 2, 3, 4, 6   # H != d, and v's width differs from q's and k's: a k/v or S/Sᵀ mix-up shows
# (Tq, Tk, dtype) of the non-causal form: square, more keys than queries (the sums run over the
# keys alone), one query, and float32.
NONCAUSAL = [(6, 6, torch.float64), (3, 8, torch.float64), (1, 5, torch.float64), (5, 7, torch.float32)]
# (T, dtype) of the causal form: a single token (where causal and not agree), then longer ones.
CAUSAL = [(1, torch.float64), (7, torch.float64), (12, torch.float64), (9, torch.float32)]
# (prefix, tokens, dtype) of the step checks: from no state (prefix None), and from a state the
# grader hands in, the running sums of a prefix of that many tokens.
STEPS = [(None, 6, torch.float64), (5, 3, torch.float64), (None, 4, torch.float32)]
# The memory check: a small key width and a wide value, so that a token's key and value (33 kB in
# float64) stand out of the interpreter's own allocations when a stream of 64 is kept (2 MiB),
# while the state (S, z) stays 131 kB whatever the length.
MEMORY = {"B": 2, "H": 2, "D": 4, "DV": 1024, "T": 64}
WARM_UP = 8   # tokens stepped before the measured stream: every code path has run, the allocator is warm
# (T, gamma, dtype) of the decayed causal form; (prefix, tokens, gamma) of the decayed step, from
# no state and from a decayed state handed in.
DECAYED = [(9, 0.8, torch.float64), (12, 0.5, torch.float32)]
DECAYED_STEPS = [(None, 5, 0.8), (4, 3, 0.5)]
# The chunked form on 12 tokens: chunks of 1, of 4 (a divisor), of 5 (5, 5 and a last chunk of 2:
# three chunks, so the state is carried twice), and of 16 (one chunk of 12, shorter than its size).
CHUNK_T, CHUNKS, GAMMAS = 12, (1, 4, 5, 16), (1.0, 0.7)
# Recorded shapes: B 1 and H 2 keep any batch axis below T = 16, the chunks' axis folded in too
# (2 x 4 at most); d 5 and dv 3 are no other size. Chunks of 4 (a divisor) and of 6 (6, 6 and 4).
WHOLE = {"B": 1, "H": 2, "T": 16, "D": 5, "DV": 3, "CHUNKS": (4, 6), "gamma": 0.9}

QKV_CASE = "q ({B}, {H}, {Tq}, {D}), k ({B}, {H}, {Tk}, {D}), v ({B}, {H}, {Tk}, {DV}), {dtype} standard normal"


def qkv(rng, Tq, Tk, dtype=torch.float64, b=B, h=H, d=D, dv=DV):
    return normal(rng, b, h, Tq, d).to(dtype), normal(rng, b, h, Tk, d).to(dtype), normal(rng, b, h, Tk, dv).to(dtype)


def qkv_case(q, k, v, about=""):
    text = QKV_CASE.format(B=q.shape[0], H=q.shape[1], Tq=q.shape[2], Tk=k.shape[2], D=q.shape[3], DV=v.shape[3],
                           dtype=str(q.dtype).removeprefix("torch."))
    return text + (f"; {about}" if about else "")


def decayed(gamma):
    """The keyword a call passes for a decay: none for gamma = 1, the default."""
    return {} if gamma == 1 else {"gamma": gamma}


def attention_call(causal, gamma=1.0):
    return f"linear_attention(q, k, v, causal={causal}" + (f", gamma={gamma})" if gamma != 1 else ")")


def check_attention(learner, bugs, kata, device, q, k, v, causal, expected, *, against, about="", gamma=1.0):
    """The learner's linear_attention(q, k, v, causal, gamma) equals ``expected``."""
    tol, loose = kata.tolerance(q.dtype), kata.tolerance("float32")
    got = learner.linear_attention(q, k, v, causal=causal, **decayed(gamma))
    expect.array(got, expected, call=attention_call(causal, gamma), case=qkv_case(q, k, v, about), what="the output",
                 device=device, against=against, **tol, float32_inside=expect.float32_inside(kata, q.dtype),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.linear_attention(q, k, v, causal, gamma), **loose))


def state_form(got, *, call, case):
    """(out, S, z) of what linear_attention_step returned, once it is a pair (out, (S, z))."""
    pair = type(got) in (tuple, list) and len(got) == 2
    expect.that(pair and type(got[1]) in (tuple, list) and len(got[1]) == 2,
                "linear_attention_step must return a pair (out, state), the state a pair (S, z).", call=call,
                case=case, got=describe_value(got), expected="tuple (out (B, H, dv), (S (B, H, d, dv), z (B, H, d)))")
    return got[0], got[1][0], got[1][1]


def step_call(t, state, gamma=1.0):
    return f"linear_attention_step(q[:, :, {t}], k[:, :, {t}], v[:, :, {t}], {state}" + \
        (f", gamma={gamma})" if gamma != 1 else ")")


@recorded
def trusted_decode(step, q, k, v, state, gamma=1.0):
    """A trusted linear_attention_step run over the tokens of q, k, v from ``state`` with decay
    ``gamma``: the outputs (B, H, T, dv) and, after each token, the state (S, z)."""
    outs, states = [], []
    for t in range(q.shape[-2]):
        out, state = step(q[..., t, :], k[..., t, :], v[..., t, :], state, gamma)
        outs.append(out)
        states.append(state)
    return torch.stack(outs, dim=-2), states


def check_steps(learner, bugs, kata, rng, device, prefix, T, dtype=torch.float64, sizes=(B, H, D, DV), gamma=1.0):
    """Stepping the learner's linear_attention_step through T tokens with decay ``gamma``, from no
    state or from the running sums of a prefix of ``prefix`` tokens: every output and every state
    equal the reference's, in type, shape, dtype and values."""
    b, h, d, dv = sizes
    q, k, v = qkv(rng, T, T, dtype, b, h, d, dv)
    if prefix is None:
        state, given, about = None, "None", "from no state (state=None: no token before the first)"
    else:
        k0, v0 = normal(rng, b, h, prefix, d).to(dtype), normal(rng, b, h, prefix, dv).to(dtype)
        state, given = bugs.expected.running_sums(k0, v0, gamma), "state"
        sums = ("S = Σ phi(k_j) v_jᵀ, z = Σ phi(k_j)" if gamma == 1 else
                f"S = Σ {gamma}^({prefix - 1}-j) phi(k_j) v_jᵀ, z = Σ {gamma}^({prefix - 1}-j) phi(k_j)")
        about = (f"from a state handed in: (S, z) of {prefix} earlier tokens ({sums}), so the first token "
                 f"here sits at position {prefix}")
    if gamma != 1:
        about += f"; decay gamma = {gamma}"
    want_out, want_states = trusted_decode(bugs.reference.linear_attention_step, q, k, v, state, gamma)
    tol, loose = kata.tolerance(dtype), kata.tolerance("float32")
    inside = expect.float32_inside(kata, dtype)
    case = qkv_case(q, k, v, f"{T} tokens stepped one at a time, {about}")
    start = state
    for t in range(T):
        call = step_call(t, given if t == 0 else "state", gamma)
        got = learner.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state, **decayed(gamma))
        out, S, z = state_form(got, call=call, case=case)

        def diagnose():
            return bugs.match(got, lambda impl: _nth(trusted_decode(impl.linear_attention_step, q, k, v, start, gamma),
                                                     t), **loose)

        for what, value, want in (("out", out, want_out[..., t, :]), ("S", S, want_states[t][0]),
                                  ("z", z, want_states[t][1])):
            expect.array(value, want, call=call, case=case, what=what, device=device, **tol, float32_inside=inside,
                         against=f"the reference's {what} after token {t}", diagnose=diagnose)
        state, given = (S, z), "state"


def _nth(decoded, t):
    """(out, (S, z)) of token t of a trusted decode: what a step returns there."""
    outs, states = decoded
    return outs[..., t, :], states[t]


def stepped(learner, q, k, v, *, case, gamma=1.0):
    """The learner's linear_attention_step run over every token from no state: outputs (B, H, T, dv)."""
    state, outs = None, []
    for t in range(q.shape[-2]):
        call = step_call(t, "None" if t == 0 else "state", gamma)
        out, S, z = state_form(learner.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state,
                                                             **decayed(gamma)), call=call, case=case)
        expect.type_of(out, torch.Tensor, call=call, case=case, what="out")
        outs.append(out.cpu())
        state = (S, z)
    shapes = {tuple(o.shape) for o in outs}
    expect.that(len(shapes) == 1, "The outputs of the steps differ in shape.", call="linear_attention_step",
                case=case, got=", ".join(str(s) for s in sorted(shapes)), expected=f"one shape, {tuple(q.shape[:2])} + (dv,)")
    return torch.stack(outs, dim=-2)


def test_feature_map_values(learner, bugs, kata, rng, device):
    """elu_feature_map(x) is elu(x) + 1: x + 1 above 0, exp(x) below, in x's dtype and shape"""
    edges = torch.tensor([-30.0, -3.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 3.0, 30.0], dtype=torch.float64)
    for x in (edges, normal(rng, B, H, 5, D) * 2, normal(rng, B, H, 3, D).float() * 2):
        call = "elu_feature_map(x)"
        case = (f"x = {edges.tolist()}" if x is edges else
                f"x {str(x.dtype).removeprefix('torch.')} {list(x.shape)}, normal with standard deviation 2")
        got = learner.elu_feature_map(x)
        expect.array(got, bugs.expected.feature_map(x), call=call, case=case, what="phi(x)", device=device,
                     against="elu(x) + 1: x + 1 for x > 0, exp(x) otherwise", **kata.tolerance(x.dtype))


def test_noncausal_matches(learner, bugs, kata, rng, device):
    """causal=False equals the reference and the quadratic form phi(q) phi(k)ᵀ, each row divided by its sum, times v"""
    for Tq, Tk, dtype in NONCAUSAL:
        q, k, v = qkv(rng, Tq, Tk, dtype)
        check_attention(learner, bugs, kata, device, q, k, v, False, bugs.reference.linear_attention(q, k, v, causal=False),
                        against="the reference, computed in float64")
    q, k, v = qkv(rng, 5, 8)
    check_attention(learner, bugs, kata, device, q, k, v, False, bugs.expected.kernel_attention(q, k, v, False),
                    against="(phi(q) @ phi(k)ᵀ, each row divided by its sum) @ v: the T x T form")


def test_causal_matches(learner, bugs, kata, rng, device):
    """causal=True equals the reference and the quadratic form with the similarities of future keys zeroed"""
    for T, dtype in CAUSAL:
        q, k, v = qkv(rng, T, T, dtype)
        check_attention(learner, bugs, kata, device, q, k, v, True, bugs.reference.linear_attention(q, k, v, causal=True),
                        against="the reference, computed in float64")
    q, k, v = qkv(rng, 8, 8)
    check_attention(learner, bugs, kata, device, q, k, v, True, bugs.expected.kernel_attention(q, k, v, True),
                    against="(phi(q) @ phi(k)ᵀ with j > i zeroed, each row divided by its sum) @ v: the T x T form")


def test_causal_ignores_the_future(learner, bugs, kata, rng, device):
    """causal=True: changing the tokens from position t on leaves the outputs before t unchanged"""
    T = 9
    q, k, v = qkv(rng, T, T)
    call, tol = attention_call(True), kata.tolerance("float64")
    first = learner.linear_attention(q, k, v, causal=True)
    expect.form(first, torch.Tensor, (B, H, T, DV), dtype=torch.float64, device=device, call=call,
                case=qkv_case(q, k, v), what="the output")
    # Two cut points whose only common divisor is 1: a form computed in chunks that leaks the
    # future inside a chunk shows at one of them, whatever the chunk's length.
    for t0 in (4, 7):
        q2, k2, v2 = (torch.cat([x[..., :t0, :], normal(rng, *x[..., t0:, :].shape)], dim=-2) for x in (q, k, v))
        case = qkv_case(q, k, v, f"then q, k and v of positions {t0}..{T - 1} replaced by fresh draws")
        second = learner.linear_attention(q2, k2, v2, causal=True)
        expect.form(second, torch.Tensor, (B, H, T, DV), dtype=torch.float64, device=device, call=call, case=case,
                    what="the output")
        # An output before t0 that moves with the tokens after it comes from a sum over keys after
        # its query, whichever sum it is: the property names the bug when no oracle gives this output.
        expect.values(second[..., :t0, :], first[..., :t0, :], call=call, case=case, **tol,
                      what=f"the outputs at positions 0..{t0 - 1}", against="the same outputs before the change",
                      diagnose=lambda: bugs.match(first, lambda impl: impl.linear_attention(q, k, v, causal=True),
                                                  **kata.tolerance("float32")) or "non-causal-sum")


def test_constant_values_pass_through(learner, bugs, kata, rng, device):
    """each output is a weighted mean of values (the weights sum to 1): values equal for every token come out unchanged"""
    T = 7
    q, k, _ = qkv(rng, T, T)
    c = normal(rng, B, H, 1, DV)
    v = c.expand(B, H, T, DV).clone()   # (B, H, T, dv): every token's value is c
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    case = qkv_case(q, k, v, "v[:, :, t] = c for every t: a mean of equal values is that value")
    for causal in (True, False):
        got = learner.linear_attention(q, k, v, causal=causal)
        expect.array(got, v, call=attention_call(causal), case=case, what="the output", device=device, **tol,
                     against="v itself", float32_inside=expect.float32_inside(kata),
                     diagnose=lambda: bugs.match(got, lambda impl: impl.linear_attention(q, k, v, causal=causal), **loose))
    got = stepped(learner, q, k, v, case=case)
    expect.array(got, v, call="linear_attention_step, token by token from state=None", case=case,
                 what="the outputs, stacked over the tokens", **tol, against="v itself",
                 float32_inside=expect.float32_inside(kata),
                 diagnose=lambda: bugs.match(got, lambda impl: trusted_decode(impl.linear_attention_step, q, k, v,
                                                                              None)[0], **loose))


def test_step_matches(learner, bugs, kata, rng, device):
    """linear_attention_step: each out and each state (S, z) equal the reference's, from no state and from a state handed in"""
    for prefix, T, dtype in STEPS:
        check_steps(learner, bugs, kata, rng, device, prefix, T, dtype)


def test_recurrent_equals_parallel(learner, bugs, kata, rng, device):
    """stepping token by token from no state gives your causal linear_attention's outputs"""
    for T, sizes in ((12, (B, H, D, DV)), (6, (3, 2, 5, 3))):
        q, k, v = qkv(rng, T, T, torch.float64, *sizes)
        case = qkv_case(q, k, v, "linear_attention_step from state=None, token by token, against "
                                 "linear_attention(q, k, v, causal=True) on the whole sequence")
        got = stepped(learner, q, k, v, case=case)
        parallel = learner.linear_attention(q, k, v, causal=True)
        expect.type_of(parallel, torch.Tensor, call=attention_call(True), case=case, what="the output")
        expect.array(got, parallel.cpu(), call="linear_attention_step, token by token", case=case,
                     what="the outputs, stacked over the tokens", against="your linear_attention(q, k, v, causal=True)",
                     **kata.tolerance("float64"), float32_inside=expect.float32_inside(kata))


def floating_bytes(value, depth=0) -> int:
    """Bytes of the floating-point tensors in ``value`` (tensors, and the tuples, lists and dicts
    that hold them)."""
    if type(value) is torch.Tensor:
        return value.numel() * value.element_size() if value.is_floating_point() else 0
    items = list(value.values()) if type(value) is dict else value if type(value) in (list, tuple) else ()
    return sum(floating_bytes(item, depth + 1) for item in items) if depth < 4 else 0


def test_decode_memory_constant(learner, rng, device):
    """decoding 64 tokens one at a time: the state stays one size, the sandbox's memory does not grow with the stream, one step creates at most four states"""
    m = MEMORY
    T, b, h, d, dv = m["T"], m["B"], m["H"], m["D"], m["DV"]
    q, k, v = qkv(rng, T, T, torch.float64, b, h, d, dv)
    state_size = b * h * (d * dv + d) * 8   # S and z in float64
    token = b * h * (d + dv) * 8   # one token's key and value
    case = (f"q, k ({b}, {h}, {T}, {d}), v ({b}, {h}, {T}, {dv}), float64, stepped one token at a time from "
            f"state=None: a state (S, z) is {state_size:,} bytes, a token's key and value {token:,}")

    def streamed(n):
        """The state after stepping the first n tokens, its size checked after each."""
        state, first = None, None
        for t in range(n):
            call = step_call(t, "None" if t == 0 else "state")
            out, S, z = state_form(learner.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state),
                                   call=call, case=case)
            state = (S, z)
            size = floating_bytes(state)
            first = size if first is None else first
            expect.that(size == first, "The state grows with the tokens: a recurrent state is the same size "
                        "after any number of tokens.", call=call, case=case,
                        got=f"{first:,} bytes of state after token 0, {size:,} after token {t}",
                        expected=f"{first:,} bytes after every token", diagnose=lambda: "state-grows-with-t")
        return state

    # A first, short stream runs every code path once, so that the worker's memory grows, over the
    # whole stream, by what it keeps, wherever it keeps it (a global, a closure, NumPy, a view).
    streamed(WARM_UP)
    before = learner.resident_bytes()
    state = streamed(T)
    after = learner.resident_bytes()
    grown = None if None in (before, after) else after - before
    # Two states, and 512 KiB for the interpreter's own allocations. Keeping every token's key and
    # value costs 2 MiB more here.
    limit = 2 * state_size + (512 << 10)
    expect.that(grown is None or grown <= limit, f"After {T} tokens, the sandbox holds more memory than two states: "
                "decoding keeps something of every token besides (S, z), so its memory grows with the stream.",
                call="resident memory of the sandbox, as the kernel counts it",
                case=case + f"; after {WARM_UP} tokens stepped once, the whole stream",
                got=f"{grown:,} bytes more after the stream ({grown / token:.1f} tokens' keys and values)",
                expected=f"at most {limit:,} bytes (two states, and 512 KiB)", diagnose=lambda: "state-grows-with-t")
    q1, k1, v1 = normal(rng, b, h, d), normal(rng, b, h, d), normal(rng, b, h, dv)
    call = "linear_attention_step(q_next, k_next, v_next, state)"
    peak = learner.peak_bytes(learner.linear_attention_step, q1, k1, v1, state)
    # phi(k) v_tᵀ and S + phi(k) v_tᵀ are a state each: room for four, and 64 KiB for rounding.
    limit = 4 * state_size + (64 << 10)
    expect.that(peak is not None and peak <= limit, "One step creates more memory than four states: it computes "
                "over every token so far instead of updating (S, z).", call=call,
                case=case + f"; one more token after {T}",
                got="no measurement" if peak is None else f"{peak:,} bytes created ({peak / state_size:.1f} states)",
                expected=f"at most {limit:,} bytes (four states, and 64 KiB)", diagnose=lambda: "state-grows-with-t")
    check_untampered(learner, call=call, case=case)


def test_decay_matches(learner, bugs, kata, rng, device):
    """causal=True with a decay gamma < 1 equals the reference and the T x T form that weighs key j by gamma^(i-j) for query i"""
    for T, gamma, dtype in DECAYED:
        q, k, v = qkv(rng, T, T, dtype)
        check_attention(learner, bugs, kata, device, q, k, v, True, bugs.reference.linear_attention(q, k, v, True, gamma),
                        against="the reference", gamma=gamma)
    q, k, v = qkv(rng, 8, 8)
    check_attention(learner, bugs, kata, device, q, k, v, True, bugs.expected.kernel_attention(q, k, v, True, 0.9),
                    against="(phi(q) @ phi(k)ᵀ times 0.9^(i-j), j > i zeroed, each row divided by its sum) @ v",
                    gamma=0.9)


def test_decay_needs_causal(learner, rng):
    """causal=False with gamma != 1 raises ValueError (or AssertionError): a decay runs along the causal order"""
    q, k, v = qkv(rng, 3, 5)
    learner.linear_attention(q, k, v, causal=False)   # a valid call first: only the decayed one may raise
    case = qkv_case(q, k, v, "gamma = 0.5 with causal=False: every query sees every key, so no key is older")
    expect.refused(lambda: learner.linear_attention(q, k, v, causal=False, gamma=0.5), call=attention_call(False, 0.5),
                   case=case, expected="ValueError (or AssertionError): the decay needs causal=True",
                   returned="A decay was accepted without the causal order it runs along.",
                   raised="The decay without causal order failed somewhere inside instead of being refused: check "
                          "causal and gamma first.")


def test_decay_step_matches(learner, bugs, kata, rng, device):
    """linear_attention_step with a decay gamma < 1: each out and each state (S, z) equal the reference's, from no state and from a decayed state handed in"""
    for prefix, T, gamma in DECAYED_STEPS:
        check_steps(learner, bugs, kata, rng, device, prefix, T, gamma=gamma)


def chunked_call(C, gamma):
    return f"linear_attention_chunked(q, k, v, {C}, gamma={gamma})"


def chunk_sizes(T, C):
    """The chunks' lengths, in words: 'chunks of 5, 5 and 2'."""
    sizes = [min(C, T - start) for start in range(0, T, C)]
    return ("one chunk of " if len(sizes) == 1 else "chunks of ") + \
        (", ".join(map(str, sizes[:-1])) + " and " if len(sizes) > 1 else "") + str(sizes[-1])


def check_chunked(learner, bugs, kata, device, q, k, v, C, gamma, expected, *, against):
    """The learner's linear_attention_chunked(q, k, v, C, gamma) equals ``expected``."""
    tol, loose = kata.tolerance(q.dtype), kata.tolerance("float32")
    got = learner.linear_attention_chunked(q, k, v, C, gamma=gamma)
    case = qkv_case(q, k, v, f"{chunk_sizes(q.size(2), C)}, decay gamma = {gamma}")
    expect.array(got, expected, call=chunked_call(C, gamma), case=case, what="the output", device=device,
                 against=against, **tol, float32_inside=expect.float32_inside(kata, q.dtype),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.linear_attention_chunked(q, k, v, C, gamma), **loose))


STEPPED = "the reference's linear_attention_step, token by token from state=None"


def test_chunked_matches(learner, bugs, kata, rng, device):
    """linear_attention_chunked equals the reference's steps: chunks of 1, of a divisor of T, of a size that leaves a shorter last chunk, and longer than T; gamma 1 and 0.7; float64 and float32"""
    for gamma in GAMMAS:
        q, k, v = qkv(rng, CHUNK_T, CHUNK_T)
        want = trusted_decode(bugs.reference.linear_attention_step, q, k, v, None, gamma)[0]
        for C in CHUNKS:
            check_chunked(learner, bugs, kata, device, q, k, v, C, gamma, want, against=STEPPED)
    q, k, v = qkv(rng, 9, 9, torch.float32)
    want = trusted_decode(bugs.reference.linear_attention_step, q, k, v, None, 0.9)[0]
    check_chunked(learner, bugs, kata, device, q, k, v, 4, 0.9, want, against=STEPPED)


def test_chunked_equals_recurrent(learner, kata, rng, device):
    """your linear_attention_chunked equals your linear_attention_step run token by token from no state"""
    q, k, v = qkv(rng, 9, 9, torch.float64, 3, 2, 5, 3)
    case = qkv_case(q, k, v, f"{chunk_sizes(9, 4)}, decay gamma = 0.8, against linear_attention_step from "
                             "state=None, token by token")
    steps = stepped(learner, q, k, v, case=case, gamma=0.8)
    call = chunked_call(4, 0.8)
    got = learner.linear_attention_chunked(q, k, v, 4, gamma=0.8)
    expect.type_of(got, torch.Tensor, call=call, case=case, what="the output")
    expect.array(got.cpu(), steps, call=call, case=case, what="the output",
                 against="your linear_attention_step, token by token", **kata.tolerance("float64"),
                 float32_inside=expect.float32_inside(kata))


def test_chunked_works_by_chunks(learner, rng):
    """linear_attention_chunked with chunks shorter than T builds nothing of T x T or (T, d, dv): recorded shapes"""
    w = WHOLE
    T, d, dv, gamma = w["T"], w["D"], w["DV"], w["gamma"]
    q, k, v = qkv(rng, T, T, torch.float64, w["B"], w["H"], d, dv)
    for C in w["CHUNKS"]:
        call = chunked_call(C, gamma)
        case = qkv_case(q, k, v, f"{chunk_sizes(T, C)}; every torch call recorded, with the shapes of its "
                                 "tensors and of its matrix products' results")
        # One call first, on other values: lazy imports and memoised results cannot hide the recorded one's work.
        learner.linear_attention_chunked(torch.flip(q, dims=(-2,)), k, v, C, gamma=gamma)
        with learner.recording() as ops:
            learner.linear_attention_chunked(q, k, v, C, gamma=gamma)
        shapes = float_shapes(ops) + [found[1] for found in map(product, ops) if found is not None]
        # T x T: two axes of T or more (padded to whole chunks too). (T, d, dv): a state for every token.
        whole = [shape for shape in shapes if sum(n >= T for n in shape) >= 2
                 or (any(n >= T for n in shape) and d in shape and dv in shape)]
        expect.that(not whole, f"A tensor of the whole sequence's weights (T x T) or states (T, d, dv) was built: "
                    f"the chunked form holds a chunk's {C} x {C} weights and one state (S, z) at a time.", call=call,
                    case=case, got=f"a tensor of shape {whole[0]}" if whole else None,
                    expected=f"no two axes of {T} or more, and no axis of {T} or more beside d = {d} and dv = {dv}",
                    diagnose=lambda: "not-chunked")
    check_untampered(learner, call=call, case=case)
