"""Grader of the kv-cache kata (katas/kv-cache/README.md)."""
import re
from math import prod

import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import CheckFailed, LearnerRaised, SandboxFailed
from graders.engine.learner import describe_value
from graders.engine.recording import NotRecorded, recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import inject, listing, normal

# (B, d_model, n_heads, n_kv_heads): groups of 3 over 2 KV heads and of 2 over 4, so a cache that
# holds the repeated heads (6 or 8) cannot pass for one that holds the KV heads (2 or 4), and
# head_dim (4, 5) differs from n_heads and n_kv_heads.
CONFIGS = [(2, 24, 6, 2), (3, 40, 8, 4)]
# The caches the cache checks fill by hand: (B, n_kv_heads, head_dim), the tokens of each append.
# The first two appends have one length, so a cache that concatenates along another axis answers
# with a wrong shape before it fails; the running lengths 2, 4, 5, 8, 9 equal n_kv_heads or
# head_dim once at most, so a len() read from another axis is caught at the next append.
GROWTH = ((3, 2, 5), (2, 2, 1, 3, 1))
GROWTH32 = ((2, 4, 3), (3, 1, 2))
AXES = ("batch", "KV heads", "time", "head_dim")
CASE = ("x: {dtype} ({B}, {T}, {d}), standard normal; n_heads={H}, n_kv_heads={Hkv}; weights injected "
        "(W ~ N(0, 1/{d})); eval mode")
SDPA = "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) on the whole sequence at once"


def shapes(d, H, Hkv):
    kv = Hkv * (d // H)
    return {"q_proj.weight": [d, d], "k_proj.weight": [kv, d], "v_proj.weight": [kv, d], "o_proj.weight": [d, d]}


def weights(rng, d, H, Hkv, dtype=torch.float64):
    """A state_dict to inject. W ~ N(0, 1/d) keeps q, k, v at unit variance, so correctly scaled
    scores stay near unit variance too and a key seen or hidden moves the softmax visibly."""
    return {name: normal(rng, *shape, std=d ** -0.5).to(dtype) for name, shape in shapes(d, H, Hkv).items()}


def case_text(x, H, Hkv, about=""):
    B, T, d = x.shape
    text = CASE.format(dtype=str(x.dtype).removeprefix("torch."), B=B, T=T, d=d, H=H, Hkv=Hkv)
    return text + (f"; {about}" if about else "")


def schedule_text(chunks) -> str:
    """``chunks of 2, 4, 1 tokens (start_pos 0, 2, 6)``: where each call of a decoding starts."""
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    return f"chunks of {', '.join(map(str, chunks))} tokens (start_pos {', '.join(map(str, starts))})"


def build(learner, device, sd, H, Hkv):
    """The learner's module: constructed, its parameters checked, cast, moved, weights injected, eval.
    Parameters beside the injected ones cost only the parameter-count check."""
    d = sd["q_proj.weight"].shape[0]
    return inject(learner, learner.GroupedQueryAttention(d, H, Hkv), sd, device=device,
                  call=f"GroupedQueryAttention({d}, {H}, {Hkv})",
                  problem="The module lacks the projections the grader injects its weights into.",
                  hint=f": head_dim = {d} // {H} = {d // H}, and K and V have only n_kv_heads * head_dim = "
                  f"{Hkv * (d // H)} outputs; bias=False")


def heads(t, n, hd):
    """(B, T, n * hd) -> (B, n, T, hd): the kata's layout of keys and values."""
    B, T, _ = t.shape
    return t.view(B, T, n, hd).transpose(1, 2)


def kv_of(sd, H, Hkv, x):
    """The keys and values of x under the injected weights, (B, Hkv, T, hd) each, in float64:
    what the cache must hold after the module has seen x."""
    hd = sd["q_proj.weight"].shape[0] // H
    xd = x.double()
    return tuple(heads(xd @ sd[name].double().T, Hkv, hd) for name in ("k_proj.weight", "v_proj.weight"))


def sdpa_causal(sd, H, Hkv, x):
    """F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) given the same weights, on
    the whole of x at once, in float64: an oracle nobody here wrote, of what decoding must give."""
    hd = x.shape[-1] // H
    w = {k: v.double() for k, v in sd.items()}
    xd = x.double()
    q = heads(xd @ w["q_proj.weight"].T, H, hd)   # (B, H, T, hd)
    k, v = kv_of(sd, H, Hkv, x)   # (B, Hkv, T, hd)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)   # (B, H, T, hd)
    return (y.transpose(1, 2).reshape(x.shape) @ w["o_proj.weight"].T).to(x.dtype)   # (B, T, d)


@recorded
def trusted(module, cache_cls, sd, H, Hkv, xs, schedules):
    """What a trusted module and cache (the reference's or a bug's) give, in float64 on the CPU:
    each sequence of ``xs`` decoded in its chunks with one cache, reset between sequences; one
    (B, T, d) output per sequence, its chunks' outputs concatenated over time. A schedule of None
    is one call without a cache."""
    with torch.no_grad():
        m = module(xs[0].shape[-1], H, Hkv).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        cache, outs = cache_cls(), []
        for i, (x, chunks) in enumerate(zip(xs, schedules)):
            if chunks is None:
                outs.append(m(x.double()).to(x.dtype))
                continue
            if i:
                cache.reset()
            starts = [sum(chunks[:j]) for j in range(len(chunks))]
            pieces = [m(x[:, s:s + t].double(), cache=cache, start_pos=s) for s, t in zip(starts, chunks)]
            outs.append(torch.cat(pieces, dim=1).to(x.dtype))
    return tuple(outs)


@recorded
def cache_trace(cache_cls, ops):
    """What a trusted KVCache answers to ``ops``, in order: to ("append", k, v) the pair it
    returns and its len after, (k_all, v_all, len); to ("reset",) its len after; "raised" for the
    first op that raises, and nothing after it."""
    cache, trace = cache_cls(), []
    for op in ops:
        try:
            if op[0] == "reset":
                cache.reset()
                trace.append(len(cache))
            else:
                k_all, v_all = cache.append(op[1], op[2])
                trace.append((k_all.clone(), v_all.clone(), len(cache)))   # a buffer's views change later
        except Exception:
            trace.append("raised")
            break
    return trace


def appends(rng, shape, chunks, dtype=torch.float64):
    """("append", k, v) ops of (B, Hkv, t, hd) keys and values, standard normal, one per chunk."""
    B, Hkv, hd = shape
    return [("append", normal(rng, B, Hkv, t, hd).to(dtype), normal(rng, B, Hkv, t, hd).to(dtype)) for t in chunks]


def ops_text(ops) -> str:
    """``append 2, append 2, reset, append 1``: the calls a cache check makes, in order."""
    return ", ".join("reset" if op[0] == "reset" else f"append {op[1].shape[2]}" for op in ops)


def shape_sentence(what, value, want) -> str:
    """Why a cached tensor's shape is wrong: an axis other than time changed, or time holds too few
    or too many tokens."""
    if value.dim() != 4:
        return f"{what} has the wrong shape: the cache's layout is (B, n_kv_heads, t, head_dim)."
    others = [f"{AXES[i]} ({want[i]} -> {value.shape[i]})" for i in (0, 1, 3) if value.shape[i] != want[i]]
    if others:
        return (f"{what} has the wrong shape: its {' and '.join(others)} axis changed, where only time (axis 2) "
                "may grow.")
    return f"{what} holds {value.shape[2]} tokens, but {want[2]} were appended since the cache was empty."


def drive_cache(learner, bugs, device, ops, case):
    """Run ``ops`` on a fresh learner KVCache and judge each answer as it comes: the pair append
    returns (its type, each tensor's shape, dtype, device and values: exactly the keys and values
    appended since the last reset, concatenated on the time axis) and len(cache) after each op.
    A failure is named by the bug whose cache answers the same ops the same way up to there."""
    cache, trace = learner.KVCache(), []
    diagnose = lambda: bugs.match(trace, lambda impl: cache_trace(impl.KVCache, ops)[:len(trace)], rtol=0, atol=0)
    ks, vs, done = [], [], []
    for op in ops:
        if op[0] == "reset":
            call = f"cache.reset(); len(cache)   (after {ops_text(done) or 'nothing'})"
            cache.reset()
            ks, vs = [], []
            n = expect.length(learner, cache, name="cache")
            trace.append(n)
            done.append(op)
            expect.that(n == 0, "After reset() the cache must be empty.", call=call, case=case,
                        got=f"len(cache) == {n}", expected="len(cache) == 0", diagnose=diagnose)
            continue
        _, k, v = op
        B, Hkv, t, hd = k.shape
        call = f"cache.append(k, v) with {t} new token{'s' * (t > 1)}   (after {ops_text(done) or 'nothing'})"
        try:
            got = cache.append(k, v)
        except LearnerRaised as exc:
            if exc.type_name is None:   # the method itself is missing: report that as it is
                raise
            trace.append("raised")
            try:
                exc.diagnosis = diagnose()
            except NotRecorded:   # a student bundle without this oracle value: the failure stands
                pass
            raise
        ks, vs = ks + [k], vs + [v]
        done.append(op)
        n = expect.length(learner, cache, name="cache") if type(got) is tuple and len(got) == 2 else None
        trace.append((got[0], got[1], n) if n is not None else got)
        expect.that(n is not None, "append(k, v) must return the pair (k_all, v_all): every cached key and value.",
                    call=call, case=case, got=describe_value(got),
                    expected="tuple (k_all, v_all), each (B, n_kv_heads, t_old + t_new, head_dim)", diagnose=diagnose)
        t_all = sum(x.shape[2] for x in ks)
        want = (B, Hkv, t_all, hd)
        for what, value, parts in (("k_all", got[0], ks), ("v_all", got[1], vs)):
            expect.type_of(value, torch.Tensor, call=call, case=case, what=what)
            expect.that(tuple(value.shape) == want, shape_sentence(what, value, want), call=call, case=case,
                        got=f"shape {tuple(value.shape)}",
                        expected=f"shape {want} = (B, n_kv_heads, {t_all} tokens cached, head_dim)", diagnose=diagnose)
            expect.array(value, torch.cat(parts, dim=2), call=call, case=case, what=what, rtol=0, atol=0,
                         device=device, diagnose=diagnose,
                         against=f"the {'keys' if what == 'k_all' else 'values'} appended since the cache was "
                                 "empty, concatenated on the time axis (dim 2), oldest first")
        expect.that(n == t_all, "len(cache) must be the number of tokens cached.", call=call + "; len(cache)",
                    case=case, got=f"len(cache) == {n}", expected=f"len(cache) == {t_all}", diagnose=diagnose)


def output_form(got, *, B, T, d, dtype, device, call, case):
    """A plain (B, T, d) tensor of the input's dtype on its device: one output per new token."""
    expect.form(got, torch.Tensor, (B, T, d), dtype=dtype, device=device, call=call, case=case, what="the output")


# How torch words a failed broadcast, e.g. "The size of tensor a (7) must match the size of tensor b (3)".
BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def square_mask_raised(exc, T, Tk) -> bool:
    """square-chunk-mask: a chunk of T > 1 tokens after Tk - T cached ones raised a failed
    broadcast between T and Tk: something T columns wide (a (T, T) mask without the cached keys'
    columns) met the (T, Tk) scores."""
    found = BROADCAST.search(exc.message or "")
    return (1 < T < Tk and exc.type_name == "RuntimeError" and found is not None
            and {int(found[1]), int(found[2])} == {T, Tk})


def decode(learner, m, cache, x, chunks, *, device, case):
    """The learner's module run over x chunk by chunk with ``cache``: each chunk's output judged
    for its form, then all of them concatenated over time, (B, T, d)."""
    B, T, d = x.shape
    outs, start = [], 0
    for t in chunks:
        call = f"m(x[:, {start}:{start + t}], cache=cache, start_pos={start})"
        try:
            got = m(x[:, start:start + t], cache=cache, start_pos=start)
        except LearnerRaised as exc:
            exc.call, exc.case = call, exc.case or case   # which decoding, and where in it
            if exc.diagnosis is None and square_mask_raised(exc, t, start + t):
                exc.diagnosis = "square-chunk-mask"
            raise
        output_form(got, B=B, T=t, d=d, dtype=x.dtype, device=device, call=call, case=case)
        outs.append(got.cpu())
        start += t
    return torch.cat(outs, dim=1)


def own_forward(m, x):
    """m(x) without a cache: the module's own full forward, which full-forward-matches-sdpa judges;
    None where it raises or answers no tensor of x's shape and dtype."""
    try:
        got = m(x)
    except LearnerRaised:
        return None
    if type(got) is not torch.Tensor or tuple(got.shape) != tuple(x.shape) or got.dtype != x.dtype:
        return None
    return got.cpu()


def decoded_afresh(learner, m, x, schedule, *, device, case):
    """The same module decoding x in ``schedule`` with a new KVCache; None where decoding itself
    fails (the checks of decoding say how). A sandbox failure is no answer and propagates."""
    try:
        return decode(learner, m, learner.KVCache(), x, schedule, device=device, case=case)
    except SandboxFailed:
        raise
    except CheckFailed:
        return None


FULL_FORWARD = "m(x), the same module's full forward without a cache, on the same tokens"


def judge_decoding(learner, bugs, kata, device, m, cache, sd, H, Hkv, xs, schedules, *, what, case, itself,
                   own_text=FULL_FORWARD):
    """Decode each sequence of ``xs`` in its chunks with one learner cache (``cache.reset()``
    between sequences) and judge the last sequence's outputs, naming the known bug they match.

    The property is self-consistency: the outputs must equal ``itself(m, x)``, what the same
    module gives the last sequence another way (its full forward, a fresh cache). Where they do
    not, they pass only if they are right (SDPA on the whole sequence and the reference): then the
    other way is what is wrong, and the check that judges it says so. Either way a mistake the
    module makes in both ways (a scale, a layout) is charged once, where its convention is judged."""
    for i, (x, chunks) in enumerate(zip(xs, schedules)):
        if i:
            cache.reset()
        got = decode(learner, m, cache, x, chunks, device=device, case=case)
    x, chunks = xs[-1], schedules[-1]
    call = f"m(x[:, s:s + t], cache=cache, start_pos=s) for each chunk: {what}"
    loose = kata.tolerance("float32")
    compute = lambda impl: trusted(impl.GroupedQueryAttention, impl.KVCache, sd, H, Hkv, tuple(xs),
                                   tuple(schedules))[-1]
    # Matched within float32 rounding, so that a bug written with Llama's float32 softmax is named too.
    diagnose = lambda: bugs.match(got, compute, **loose)
    judge_itself(kata, got, itself(m, x), own_text,
                 ((sdpa_causal(sd, H, Hkv, x), SDPA), (compute(bugs.reference), "the reference")),
                 call=call, case=case, what="the outputs, concatenated over time", diagnose=diagnose)


def judge_itself(kata, got, own, own_text, truths, *, call, case, what, diagnose):
    """``got`` equals ``own``, what the same module gives another way (None where that way did not
    work), or else every one of ``truths``, (expected, against) pairs that say what is right."""
    tol, inside = kata.tolerance(got.dtype), expect.float32_inside(kata, got.dtype)
    if own is not None and expect.mismatch(got, own, **(inside or tol)) is None:
        expect.values(got, own, call=call, case=case, what=what, against=own_text, **tol,
                      float32_inside=inside)   # passes, with the float32-inside note where it needs one
        return
    if own is not None and expect.mismatch(got, truths[0][0], **(inside or tol)) is not None:
        expect.array(got, own, call=call, case=case, what=what, diagnose=diagnose, against=own_text, **tol,
                     float32_inside=inside)
    for expected, against in truths:
        expect.array(got, expected, call=call, case=case, what=what, diagnose=diagnose, against=against, **tol,
                     float32_inside=inside)


def test_cache_grows_by_t(learner, bugs, rng, device):
    """KVCache: each append returns every key and value so far, (B, n_kv_heads, t, head_dim), the new tokens last, and len(cache) counts them"""
    for (shape, chunks), dtype in ((GROWTH, torch.float64), (GROWTH32, torch.float32)):
        ops = appends(rng, shape, chunks, dtype)
        B, Hkv, hd = shape
        case = (f"a fresh KVCache(); appends of k and v, {str(dtype).removeprefix('torch.')} (B, n_kv_heads, t, "
                f"head_dim) = ({B}, {Hkv}, t, {hd}), standard normal, t = {', '.join(map(str, chunks))} in turn")
        drive_cache(learner, bugs, device, ops, case)


def test_reset_starts_a_new_sequence(learner, bugs, kata, rng, device):
    """reset() empties the cache: len 0, the next append returns only the new tokens, and the module decodes a new sequence as if the cache were new"""
    ops = appends(rng, GROWTH[0], (3, 1)) + [("reset",)] + appends(rng, GROWTH[0], (2, 1))
    B, Hkv, hd = GROWTH[0]
    drive_cache(learner, bugs, device, ops, f"a fresh KVCache(); k and v float64 ({B}, {Hkv}, t, {hd}), standard "
                                            f"normal; {ops_text(ops)}")
    B, d, H, Hkv = CONFIGS[0]
    sd = weights(rng, d, H, Hkv)
    xs, schedules = (normal(rng, B, 5, d), normal(rng, B, 6, d)), ((3, 1, 1), (2, 1, 1, 1, 1))
    case = case_text(xs[1], H, Hkv, f"a first sequence of 5 tokens decoded with one KVCache, chunks 3, 1, 1, then "
                                    f"cache.reset(), then x decoded with the same cache, {schedule_text(schedules[1])}")
    m = build(learner, device, sd, H, Hkv)

    def fresh(m, x):
        """The same module decoding x with a new KVCache: what reset() must make the old one into."""
        return decoded_afresh(learner, m, x, schedules[1], device=device, case=case)

    judge_decoding(learner, bugs, kata, device, m, learner.KVCache(), sd, H, Hkv, xs, schedules,
                   what="the second sequence, after cache.reset()", case=case, itself=fresh,
                   own_text="the same module decoding x, in the same chunks, with a new KVCache()")


def test_parameter_count(learner):
    """2·d² + 2·d·n_kv_heads·head_dim parameters: q_proj and o_proj d -> d, k_proj and v_proj d -> n_kv_heads·head_dim, no biases"""
    for d, H, Hkv in ((24, 6, 2), (40, 8, 4), (24, 6, 1)):
        m = learner.GroupedQueryAttention(d, H, Hkv)
        params = {name: entry[0] for name, entry in learner.module_info(m)["parameters"].items()}
        count = sum(prod(shape) for shape in params.values())
        kv = Hkv * (d // H)
        expected = 2 * d * d + 2 * d * kv
        expect.that(params == shapes(d, H, Hkv) and count == expected,
                    "The module's parameters are not the four bias-free projections of grouped-query attention.",
                    call=f"GroupedQueryAttention({d}, {H}, {Hkv})", got=f"{count:,}: {listing(params)}",
                    expected=f"2·{d}² + 2·{d}·{kv} = {expected:,}: {listing(shapes(d, H, Hkv))} "
                             f"(n_kv_heads * head_dim = {Hkv}·{d // H} outputs for K and V), no biases")
    check_untampered(learner, call=f"GroupedQueryAttention({d}, {H}, {Hkv})")


def test_full_forward_matches_sdpa(learner, bugs, kata, rng, device):
    """without a cache, forward(x) is causal GQA: equals F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) and the reference"""
    for (B, d, H, Hkv), T, dtype in ((CONFIGS[0], 7, torch.float64), (CONFIGS[1], 6, torch.float64),
                                     (CONFIGS[0], 7, torch.float32)):
        sd, x = weights(rng, d, H, Hkv, dtype), normal(rng, B, T, d).to(dtype)
        case = case_text(x, H, Hkv, "no cache")
        call = f"GroupedQueryAttention({d}, {H}, {Hkv})(x)"
        got = build(learner, device, sd, H, Hkv)(x)
        compute = lambda impl: trusted(impl.GroupedQueryAttention, impl.KVCache, sd, H, Hkv, (x,), (None,))[0]
        diagnose = lambda: bugs.match(got, compute, **kata.tolerance("float32"))
        inside = expect.float32_inside(kata, dtype)
        for expected, against in ((sdpa_causal(sd, H, Hkv, x), SDPA.replace(" on the whole sequence at once", "")),
                                  (compute(bugs.reference), "the reference")):
            expect.array(got, expected, call=call, case=case, what="the output", diagnose=diagnose, device=device,
                         against=against, **kata.tolerance(dtype), float32_inside=inside)


def test_decode_equals_full_forward(learner, bugs, kata, rng, device):
    """decoding T tokens one at a time with a cache (start_pos 0, 1, 2, ...) gives the module's own full forward of the T tokens (or, where that is wrong, the right one)"""
    for (B, d, H, Hkv), T, dtype in ((CONFIGS[0], 7, torch.float64), (CONFIGS[1], 6, torch.float32)):
        sd, x = weights(rng, d, H, Hkv, dtype), normal(rng, B, T, d).to(dtype)
        chunks = (1,) * T
        case = case_text(x, H, Hkv, f"decoded one token at a time with one KVCache, {schedule_text(chunks)}")
        judge_decoding(learner, bugs, kata, device, build(learner, device, sd, H, Hkv), learner.KVCache(), sd, H,
                       Hkv, (x,), (chunks,), what=f"{T} tokens one at a time", case=case, itself=own_forward)


def test_chunked_prefill_bottom_right(learner, bugs, kata, rng, device):
    """chunked prefill: a chunk of Tq > 1 tokens against a longer cache is aligned bottom-right (query i at position start_pos + i), so chunks give what the same module gives in one shot"""
    for (B, d, H, Hkv), chunks in ((CONFIGS[1], (4, 3, 1, 1, 1)), (CONFIGS[0], (2, 4, 1, 2))):
        T = sum(chunks)
        sd, x = weights(rng, d, H, Hkv), normal(rng, B, T, d)
        case = case_text(x, H, Hkv, f"prefilled and decoded with one KVCache, {schedule_text(chunks)}")
        judge_decoding(learner, bugs, kata, device, build(learner, device, sd, H, Hkv), learner.KVCache(), sd, H,
                       Hkv, (x,), (chunks,), what="a prefill, a chunk of several tokens, then single tokens",
                       case=case, itself=own_forward)


def repeated_diagnosis(learner, m, x, P, keys, values, n_rep, rng, *, device, case):
    """cache-stores-repeated-kv: a new cache, filled by the module as the check's was, takes an
    append of n_heads heads and holds the module's keys and values repeated for the groups. A new
    one, because the refused append may have left the check's cache changed (a position moved on
    before a failed write)."""
    B, Hkv, t, hd = keys.shape
    try:
        cache = learner.KVCache()
        decode(learner, m, cache, x, (P, 1), device=device, case=case)
        got = cache.append(normal(rng, B, Hkv * n_rep, 1, hd), normal(rng, B, Hkv * n_rep, 1, hd))
    except SandboxFailed:
        raise
    except CheckFailed:
        return None
    if type(got) is not tuple or len(got) != 2 or not all(type(g) is torch.Tensor for g in got):
        return None
    for held, want in zip(got, (keys, values)):
        if tuple(held.shape) != (B, Hkv * n_rep, t + 1, hd):
            return None
        if expect.mismatch(held[:, :, :t], want.repeat_interleave(n_rep, dim=1), rtol=1e-5, atol=1e-5) is not None:
            return None
    return "cache-stores-repeated-kv"


def test_cache_holds_kv_heads(learner, bugs, kata, rng, device):
    """the module appends keys and values of n_kv_heads heads, before repeating them: after a prefill and a decoded token the cache holds (B, n_kv_heads, t, head_dim), the tokens' own keys and values"""
    B, d, H, Hkv = CONFIGS[0]
    hd, P = d // H, 5
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, P + 1, d)
    m = build(learner, device, sd, H, Hkv)
    cache = learner.KVCache()
    case = case_text(x, H, Hkv, f"m(x[:, :{P}], cache=cache, start_pos=0), then m(x[:, {P}:], cache=cache, "
                                f"start_pos={P}); then the grader appends one token of its own, (B, n_kv_heads, 1, "
                                f"head_dim) = ({B}, {Hkv}, 1, {hd}), to read what the cache holds")
    decode(learner, m, cache, x, (P, 1), device=device, case=case)
    n = expect.length(learner, cache, name="cache")
    expect.that(n == P + 1, "After the module's forward the cache does not count the tokens it has seen: the "
                "module must append each call's keys and values to the cache it is given.",
                call="len(cache) after the two calls", case=case, got=f"len(cache) == {n}",
                expected=f"len(cache) == {P + 1}")
    keys, values = kv_of(sd, H, Hkv, x)   # (B, Hkv, P + 1, hd)
    pk, pv = normal(rng, B, Hkv, 1, hd), normal(rng, B, Hkv, 1, hd)
    call = f"cache.append(k, v) with k, v of ({B}, {Hkv}, 1, {hd}), after the module's two calls"
    expected = f"the pair (k_all, v_all), each ({B}, {Hkv}, {P + 2}, {hd}) = (B, n_kv_heads, t, head_dim)"
    try:
        got = cache.append(pk, pv)
    except LearnerRaised as exc:
        if exc.type_name is None:
            raise
        expect.fail(f"The cache the module filled refuses keys of n_kv_heads = {Hkv} heads: what the module "
                    f"appended is not (B, n_kv_heads, t, head_dim).", call=call, case=case,
                    got=exc.message.splitlines()[0], expected=expected,
                    diagnose=lambda: repeated_diagnosis(learner, m, x, P, keys, values, H // Hkv, rng,
                                                        device=device, case=case))
    expect.that(type(got) is tuple and len(got) == 2, "append(k, v) must return the pair (k_all, v_all).",
                call=call, case=case, got=describe_value(got), expected=expected)
    tol = kata.tolerance("float64")
    for what, held, own, probe in (("k_all", got[0], keys, pk), ("v_all", got[1], values, pv)):
        expect.array(held, torch.cat([own, probe], dim=2), call=call, case=case, what=what, device=device, **tol,
                     against=f"the {'keys' if what == 'k_all' else 'values'} of x's {P + 1} tokens under the "
                             "injected weights (n_kv_heads heads, not repeated), then the grader's token")


def rejected(m, x, *, cache, start_pos, numbers, why, case):
    """m(x, cache=cache, start_pos=start_pos) raises ValueError (or AssertionError) whose message
    names each of ``numbers``."""
    call = f"m(x, {'cache=cache, ' if cache is not None else ''}start_pos={start_pos})"
    expected = (f"ValueError (or AssertionError) naming {' and '.join(map(str, numbers))}, raised before the cache "
                "is touched")
    given = {"start_pos": start_pos} if cache is None else {"cache": cache, "start_pos": start_pos}
    expect.refused(lambda: m(x, **given), call=call, case=case, expected=expected, naming=numbers,
                   raised=f"{why}, but the error raised is not the expected one.",
                   returned=f"{why}, yet the module returned an output.",
                   unnamed=f"{why}: the error is right, but its message does not say which numbers disagree.")


def test_rejects_mismatched_start_pos(learner, bugs, kata, rng, device):
    """start_pos must equal len(cache) (0 without a cache): anything else raises ValueError naming both, and leaves the cache as it was"""
    B, d, H, Hkv = CONFIGS[0]
    P = 5
    sd, x = weights(rng, d, H, Hkv), normal(rng, B, P + 1, d)
    m = build(learner, device, sd, H, Hkv)
    rejected(m, x, cache=None, start_pos=2, numbers=(2,), case=case_text(x, H, Hkv, "no cache"),
             why="Without a cache there are no earlier tokens, so start_pos=2 cannot be right")
    cache = learner.KVCache()
    case = case_text(x, H, Hkv, f"m(x[:, :{P}], cache=cache, start_pos=0) first: the cache holds {P} tokens")
    decode(learner, m, cache, x[:, :P], (P,), device=device, case=case)
    n = expect.length(learner, cache, name="cache")
    expect.that(n == P, f"After a prefill of {P} tokens the cache must hold {P}.", call="len(cache)", case=case,
                got=f"len(cache) == {n}", expected=f"len(cache) == {P}")
    for start_pos, why in ((P + 2, f"The cache holds {P} tokens, so the next one is at position {P}, not {P + 2}"),
                           (P - 2, f"The cache holds {P} tokens, so the next one is at position {P}, not {P - 2} "
                                   "(tokens the cache holds already)")):
        rejected(m, x[:, P:], cache=cache, start_pos=start_pos, numbers=(start_pos, P), why=why, case=case)
        n = expect.length(learner, cache, name="cache")
        expect.that(n == P, "A rejected call changed the cache: check start_pos before appending anything.",
                    call=f"len(cache) after m(x, cache=cache, start_pos={start_pos}) raised", case=case,
                    got=f"len(cache) == {n}", expected=f"len(cache) == {P}, as before the call")
    call = f"m(x[:, {P}:], cache=cache, start_pos={P}) after the rejected calls"
    got = m(x[:, P:], cache=cache, start_pos=P)
    output_form(got, B=B, T=1, d=d, dtype=x.dtype, device=device, call=call, case=case)
    compute = lambda impl: trusted(impl.GroupedQueryAttention, impl.KVCache, sd, H, Hkv, (x,), ((P, 1),))[0][:, P:]
    diagnose = lambda: bugs.match(got, compute, **kata.tolerance("float32"))
    # Self-consistency: the rejected calls must change nothing, so the same module decoding the
    # same tokens with a new cache must answer the same.
    own = decoded_afresh(learner, m, x, (P, 1), device=device, case=case)
    own = None if own is None else own[:, P:]
    judge_itself(kata, got.cpu(), own, f"m(x[:, {P}:], ...) after m(x[:, :{P}], ...) with a new KVCache(), without "
                 "the rejected calls", ((sdpa_causal(sd, H, Hkv, x)[:, P:], SDPA + ", its last position"),
                                        (compute(bugs.reference), "the reference")),
                 call=call, case=case, what="the output", diagnose=diagnose)


def test_banned_api(learner, kata, rng, device):
    """no SDPA or nn.MultiheadAttention: attention written by hand, with a cache and without"""
    # Only this property: forwards that complete without a library attention, whatever they return.
    # A prefill into an empty cache takes the cached path and still works with a cache that breaks
    # later; the source scan sees a library call on any path.
    B, d, H, Hkv = CONFIGS[0]
    case = case_text(normal(rng, B, 6, d), H, Hkv, "a forward without a cache, then the same tokens prefilled "
                                                 "into an empty cache")
    call = "m(x); m(x, cache=KVCache(), start_pos=0)"
    m = build(learner, device, weights(rng, d, H, Hkv), H, Hkv)
    m(normal(rng, B, 6, d))   # first call: lets lazy imports happen before recording
    x = normal(rng, B, 6, d)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    cache = learner.KVCache()
    with learner.recording() as ops:
        m(x)
        m(x, cache=cache, start_pos=0)
    used = banned_used(learner.source, ops, kata.banned)
    expect.that(not used, "The module uses a library attention this kata forbids.", call=call, case=case,
                got=", ".join(used), expected="attention written with matmul, masked_fill and softmax",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call, case=case)
