"""Grader of the mla kata (katas/mla/README.md)."""
from math import prod

import torch

from graders.engine import expect
from graders.engine.learner import describe_value
from graders.engine.products import product, shapes_in
from graders.engine.recording import recorded
from graders.engine.structure import check_untampered
from graders.engine.weights import inject, listing, normal

# (B, d_model, n_heads, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim): every size differs from the
# others (n_heads 3 against head sizes 4, 5, 6), so a per-head cache shows in its shape, and
# v_dim != qk_nope_dim. In the first, the per-head widths (4, 5, 9, 10, and n_heads times them: 12, 15, 27, 30) are
# neither n_heads, kv_lora_rank nor a cache length decoded, so a tensor of per-head keys or values of the cache shows
# in its shape. kv_lora_rank is even, so a latent turned by RoPE can be named, and so is qk_nope_dim, as in every MLA
# model: DeepSeek's view_as_complex needs q_pe's strides even.
CONFIGS = [(2, 24, 3, 16, 4, 6, 5), (3, 32, 4, 12, 6, 8, 7)]
P = 5   # prefill length before decoded tokens: the cache lengths decoding reaches (6, 7, 8) are no head size
# The absorbed check's prefill: the cache lengths its decoded steps reach (37, 38, 39, and times B, H or B·H: 74 to
# 234) are no size of CONFIGS[0]'s module (B, H, d_model, the four dims, their sums, halves and products with B, H
# or B·H: 1 to 144), so an axis of such a size is the cached tokens'.
P_ABSORBED = 36
CASE = ("x: {dtype} ({B}, {T}, {d}), standard normal; MultiHeadLatentAttention({d}, {H}, {r}, {nope}, {rope}, {v}); "
        "weights injected (W ~ N(0, 1/fan_in), no bias); eval mode")


def shapes(d, H, r, nope, rope, v):
    return {"wq.weight": [H * (nope + rope), d], "wkv_a.weight": [r + rope, d],
            "wkv_b.weight": [H * (nope + v), r], "wo.weight": [d, H * v]}


def weights(rng, d, H, r, nope, rope, v, dtype=torch.float64):
    """A state_dict to inject. W ~ N(0, 1/fan_in) keeps q, c_kv, the keys and the values at unit
    variance, so scaled scores stay near unit variance and every bug moves the softmax visibly."""
    return {name: normal(rng, *shape, std=shape[1] ** -0.5).to(dtype)
            for name, shape in shapes(d, H, r, nope, rope, v).items()}


def constructor(d, H, r, nope, rope, v) -> str:
    return f"MultiHeadLatentAttention({d}, {H}, {r}, {nope}, {rope}, {v})"


def case_text(x, H, dims, about=""):
    B, T, d = x.shape
    r, nope, rope, v = dims
    text = CASE.format(dtype=str(x.dtype).removeprefix("torch."), B=B, T=T, d=d, H=H, r=r, nope=nope, rope=rope, v=v)
    return text + (f"; {about}" if about else "")


def build(learner, device, sd, H, dims):
    """The learner's module: constructed, its parameters checked, cast, moved, weights injected, eval."""
    d = sd["wq.weight"].shape[1]
    r, nope, rope, v = dims
    return inject(learner, learner.MultiHeadLatentAttention(d, H, *dims), sd, device=device,
                  call=constructor(d, H, *dims),
                  problem="The module lacks the projections the grader injects its weights into.",
                  hint=f": wq d_model -> n_heads·(qk_nope_dim + qk_rope_dim) = {H * (nope + rope)}, wkv_a d_model -> "
                  f"kv_lora_rank + qk_rope_dim = {r + rope}, wkv_b kv_lora_rank -> n_heads·(qk_nope_dim + v_dim) = "
                  f"{H * (nope + v)}, wo n_heads·v_dim -> d_model; bias=False")


def starts(chunks):
    return [sum(chunks[:i]) for i in range(len(chunks))]


def schedule_text(chunks, absorb=False) -> str:
    flag = ", absorb=True" if absorb else ""
    return (f"chunks of {', '.join(map(str, chunks))} tokens, each call m(x[:, s:s + t], cache{flag}) given the "
            "cache the last one returned (None first)")


@recorded
def trusted(cls, sd, H, dims, x, chunks=None, absorb=False):
    """(out, cache) of a trusted module (the reference or a bug) in float64 on the CPU: one call
    per chunk of x (one call over all of x without ``chunks``), each given the cache the last one
    returned; the outputs concatenated over time, and the last cache."""
    with torch.no_grad():
        m = cls(x.shape[-1], H, *dims).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        outs, cache = [], None
        for s, t in zip(starts(chunks or (x.shape[1],)), chunks or (x.shape[1],)):
            out, cache = m(x[:, s:s + t].double(), cache, absorb=absorb)
            outs.append(out)
    return torch.cat(outs, dim=1).to(x.dtype), tuple(c.to(x.dtype) for c in cache)


def output_form(got, *, B, T, d, dtype, device, call, case):
    """forward returned (out (B, T, d_model), cache): the output's form; the cache is judged where it is the point."""
    expect.that(type(got) is tuple and len(got) == 2, "forward must return (out, cache).", call=call, case=case,
                got=describe_value(got), expected="tuple (out (B, T, d_model), (c_kv, k_rope))")
    expect.form(got[0], torch.Tensor, (B, T, d), dtype=dtype, device=device, call=call, case=case, what="the output")


def decode(m, x, chunks, absorb, *, device, case):
    """x run through the learner's module chunk by chunk, each call given the cache the last one
    returned: the outputs concatenated over time (on the CPU) and the last cache."""
    B, _, d = x.shape
    outs, cache = [], None
    for s, t in zip(starts(chunks), chunks):
        call = f"m(x[:, {s}:{s + t}], {'None' if cache is None else 'cache'}{', absorb=True' if absorb else ''})"
        got = m(x[:, s:s + t], cache, absorb=True) if absorb else m(x[:, s:s + t], cache)
        output_form(got, B=B, T=t, d=d, dtype=x.dtype, device=device, call=call, case=case)
        outs.append(got[0].cpu())
        cache = got[1]
    return torch.cat(outs, dim=1), cache


def truths(bugs, sd, H, dims, x):
    """What is right, two ways: explicit keys and values through SDPA, and the reference."""
    return ((bugs.expected.sdpa_mla(sd, H, dims, x).to(x.dtype), "every head's keys and values built explicitly "
             "(k_h = [W_uk_h c_kv ; RoPE(k_rope)], v_h = W_uv_h c_kv), then F.scaled_dot_product_attention("
             "is_causal=True)"),
            (trusted(bugs.reference.MultiHeadLatentAttention, sd, H, dims, x)[0], "the reference"))


def judge_itself(kata, got, own, own_text, right, *, call, case, what, diagnose):
    """``got`` equals ``own``, what the same module gives another way, or else every one of
    ``right`` ((expected, against) pairs): where the other way is what is wrong, the check that
    judges it says so, and a mistake made the same way in both is charged once."""
    tol, inside = kata.tolerance(got.dtype), expect.float32_inside(kata, got.dtype)
    if expect.mismatch(got, own, **(inside or tol)) is None:
        expect.values(got, own, call=call, case=case, what=what, against=own_text, **tol, float32_inside=inside)
        return
    if expect.mismatch(got, right[0][0], **(inside or tol)) is not None:
        expect.array(got, own, call=call, case=case, what=what, diagnose=diagnose, against=own_text, **tol,
                     float32_inside=inside)
    for expected, against in right:
        expect.array(got, expected, call=call, case=case, what=what, diagnose=diagnose, against=against, **tol,
                     float32_inside=inside)


def judge_decoding(learner, bugs, kata, device, sd, H, dims, x, chunks, *, absorb):
    """The module run over x in ``chunks`` equals its own naive forward over the whole of x
    (absorb=False, no cache), or, where that is wrong, the right answer."""
    m = build(learner, device, sd, H, dims)
    case = case_text(x, H, dims, schedule_text(chunks, absorb))
    B, T, d = x.shape
    full = m(x)
    output_form(full, B=B, T=T, d=d, dtype=x.dtype, device=device, call="m(x)", case=case)
    got, _ = decode(m, x, chunks, absorb, device=device, case=case)
    loose = kata.tolerance("float32")
    diagnose = lambda: bugs.match(got, lambda impl: trusted(impl.MultiHeadLatentAttention, sd, H, dims, x, chunks,
                                                             absorb)[0], **loose)
    judge_itself(kata, got, full[0].cpu(), "your module's own m(x), without a cache or absorption",
                 truths(bugs, sd, H, dims, x), call=f"{schedule_text(chunks, absorb)}, outputs concatenated",
                 case=case, what="the outputs, concatenated over time" + rows_differing(got, full[0].cpu(), chunks[0],
                                                                                         loose),
                 diagnose=diagnose)


def rows_differing(got, own, prefill, tol) -> str:
    """Where only decoding is wrong (a mask or a position that a cache shifts), which rows of the
    outputs (time steps) differ from the module's own full forward: '' unless the prefill's agree."""
    wrong = [t for t in range(got.shape[1]) if expect.mismatch(got[:, t], own[:, t], **tol) is not None]
    if not wrong or wrong[0] < prefill:
        return ""
    span = lambda a, b: f"{a}" if a == b else f"{a}-{b}"
    rows = span(wrong[0], wrong[-1]) if wrong == list(range(wrong[0], wrong[-1] + 1)) else ", ".join(map(str, wrong))
    return f" (rows {span(0, prefill - 1)}, the prefill, agree; rows {rows}, the decoded tokens, differ)"


def test_cache_bytes_per_token(learner, bugs):
    """mla_cache_bytes_per_token and kv_cache_bytes_per_token: the bytes each token costs the cache, for MLA, MHA and GQA"""
    cases = [("mla_cache_bytes_per_token", (512, 64, 60, 2), "DeepSeek-V2: kv_lora_rank 512, qk_rope_dim 64, 60 "
              "layers, bf16"),
             ("mla_cache_bytes_per_token", (512, 64), "one layer, the defaults n_layers=1, dtype_bytes=2"),
             ("mla_cache_bytes_per_token", (96, 24, 7, 4), "kv_lora_rank 96, qk_rope_dim 24, 7 layers, float32"),
             ("kv_cache_bytes_per_token", (128, 128, 60, 2), "multi-head attention of DeepSeek-V2's size: 128 "
              "heads of 128, 60 layers, bf16"),
             ("kv_cache_bytes_per_token", (8, 128, 32, 2), "GQA as in Llama 3 8B: 8 KV heads of 128, 32 layers, bf16"),
             ("kv_cache_bytes_per_token", (3, 40), "one layer, the defaults n_layers=1, dtype_bytes=2")]
    for name, args, about in cases:
        got = getattr(learner, name)(*args)
        expected = getattr(bugs.reference, name)(*args)
        call = f"{name}({', '.join(map(str, args))})"
        how = ("(kv_lora_rank + qk_rope_dim)·n_layers·dtype_bytes: one latent and one RoPE key per token and layer"
               if name.startswith("mla") else
               "2·n_kv_heads·head_dim·n_layers·dtype_bytes: a key and a value per KV head, token and layer")
        expect.that(type(got) is int and got == expected, "Wrong number of bytes per token.", call=call,
                    case=about, got=describe_value(got), expected=f"int {expected:,} = {how}",
                    diagnose=lambda: bugs.match(got, lambda impl: getattr(impl, name)(*args), rtol=0, atol=0))


def test_parameter_shapes(learner):
    """four bias-free projections: wq, wkv_a (down to the latent and the shared RoPE key), wkv_b (up from the latent), wo"""
    for B, d, H, *dims in CONFIGS:
        m = learner.MultiHeadLatentAttention(d, H, *dims)
        params = {name: entry[0] for name, entry in learner.module_info(m)["parameters"].items()}
        want = shapes(d, H, *dims)
        count = sum(prod(shape) for shape in params.values())
        expect.that(params == want, "The module's parameters are not the four projections of MLA.",
                    call=constructor(d, H, *dims), got=f"{count:,}: {listing(params)}",
                    expected=f"{sum(prod(s) for s in want.values()):,}: {listing(want)}, no biases")
    check_untampered(learner, call=constructor(d, H, *dims))


def test_full_forward_matches_reference(learner, bugs, kata, rng, device):
    """without a cache, forward(x) is causal attention over every head's keys [W_uk c_kv ; RoPE key] and values W_uv c_kv: equals SDPA on those and the reference"""
    for (B, d, H, *dims), T, dtype in ((CONFIGS[0], 7, torch.float64), (CONFIGS[1], 6, torch.float64),
                                       (CONFIGS[0], 7, torch.float32)):
        sd, x = weights(rng, d, H, *dims, dtype=dtype), normal(rng, B, T, d).to(dtype)
        case, call = case_text(x, H, dims, "no cache"), f"{constructor(d, H, *dims)}(x)"
        got = build(learner, device, sd, H, dims)(x)
        output_form(got, B=B, T=T, d=d, dtype=dtype, device=device, call=call, case=case)
        compute = lambda impl: trusted(impl.MultiHeadLatentAttention, sd, H, dims, x)[0]
        diagnose = lambda: bugs.match(got[0], compute, **kata.tolerance("float32"))
        for expected, against in truths(bugs, sd, H, dims, x):
            expect.array(got[0], expected, call=call, case=case, what="the output", diagnose=diagnose, device=device,
                         against=against, **kata.tolerance(dtype), float32_inside=expect.float32_inside(kata, dtype))


def per_token(t, B, n):
    """t (B, n, ...) or (B, ..., n, ...) as (B, n, numbers per token), or None: the layouts a cache
    of n tokens may take, time first after the batch or heads first."""
    if t.dim() < 2 or t.shape[0] != B:
        return None
    if t.shape[1] == n:
        return t.reshape(B, n, -1)
    if t.dim() == 4 and t.shape[2] == n:
        return t.transpose(1, 2).reshape(B, n, -1)
    return None


def cache_diagnosis(cache, keys, values, H, dims, B, n):
    """What a wrong cache holds instead of (c_kv, k_rope): the shared RoPE key copied to every head
    (per-head-rope-key-cached), or every head's up-projected keys (cache-holds-up-projected-keys).
    ``keys`` and ``values``: every head's full key and value, (B, H, n, nope + rope) and (B, H, n, v)."""
    r, nope, rope, v = dims
    if not isinstance(cache, (tuple, list)) or not all(type(t) is torch.Tensor for t in cache):
        return None
    k = keys.transpose(1, 2)   # (B, n, H, nope + rope)
    shared, k_nope = k[:, :, 0, nope:], k[..., :nope]   # (B, n, rope): the one key every head reads; (B, n, H, nope)
    kv = torch.cat([k_nope, values.transpose(1, 2)], dim=-1)   # (B, n, H, nope + v): wkv_b(c_kv), head by head
    close = lambda a, b: expect.mismatch(a, b, rtol=1e-5, atol=1e-5) is None
    for t in cache:
        t = per_token(t.cpu().double(), B, n)
        if t is None:
            continue
        if t.shape[-1] == H * rope and close(t, shared.repeat(1, 1, H)):
            return "per-head-rope-key-cached"
        # a head's full key or its nope part alone: judged on k_nope, whatever layout its rope part takes
        for width in (nope + rope, nope):
            if t.shape[-1] == H * width and close(t.view(B, n, H, width)[..., :nope], k_nope):
                return "cache-holds-up-projected-keys"
        if t.shape[-1] == H * (nope + v) and close(t, kv.reshape(B, n, -1)):   # wkv_b(c_kv) cached
            return "cache-holds-up-projected-keys"
    return None


def test_cache_holds_latent_and_shared_rope_key(learner, bugs, kata, rng, device):
    """after a prefill and a decoded token the cache is (c_kv (B, t, kv_lora_rank), k_rope (B, t, qk_rope_dim)): the latent and ONE rotated RoPE key per token, kv_lora_rank + qk_rope_dim numbers"""
    B, d, H, *dims = CONFIGS[0]
    r, nope, rope, v = dims
    sd, x = weights(rng, d, H, *dims), normal(rng, B, P + 1, d)
    m = build(learner, device, sd, H, dims)
    case = case_text(x, H, dims, f"out, cache = m(x[:, :{P}]); out, cache = m(x[:, {P}:], cache): the cache after "
                                 f"{P + 1} tokens")
    _, cache = decode(m, x, (P, 1), False, device=device, case=case)
    call = f"the cache m(x[:, {P}:], cache) returned"
    expected = (f"(c_kv, k_rope): c_kv ({B}, {P + 1}, {r}) = (B, t, kv_lora_rank) and k_rope ({B}, {P + 1}, {rope}) "
                f"= (B, t, qk_rope_dim), {r + rope} numbers per token, where every head's keys and values would "
                f"take {H * (nope + rope + v)}")
    keys, values = bugs.expected.keys_and_values(sd, H, dims, x)
    diagnose = lambda: (cache_diagnosis(cache, keys, values, H, dims, B, P + 1)
                        or bugs.match(cache, lambda impl: trusted(impl.MultiHeadLatentAttention, sd, H, dims, x,
                                                                  (P, 1))[1], **kata.tolerance("float32")))
    expect.that(type(cache) is tuple and len(cache) == 2, "The cache must be the pair (c_kv, k_rope).", call=call,
                case=case, got=describe_value(cache), expected=expected, diagnose=diagnose)
    c_kv, k_rope = bugs.expected.latent(sd, x, r)
    tol = kata.tolerance("float64")
    for what, held, want, against in (
            ("c_kv", cache[0], c_kv, "x @ W_dkvᵀ, the first kv_lora_rank outputs of wkv_a: the latent, not rotated"),
            ("k_rope", cache[1], k_rope, "the last qk_rope_dim outputs of wkv_a, each token's pairs (k[2i], k[2i+1]) "
                                         "turned by its position·θ_i: one key shared by every head")):
        if tuple(held.shape) != tuple(want.shape):
            expect.fail(f"The cached {what} has the wrong shape: the cache holds {r + rope} numbers per token, "
                        f"kv_lora_rank for c_kv and qk_rope_dim for k_rope.", call=call, case=case,
                        got=f"{describe_value(held)}: {', '.join(describe_value(t) for t in cache)} in the cache",
                        expected=expected, diagnose=diagnose)
        expect.array(held, want, call=call, case=case, what=f"the cached {what}", device=device, diagnose=diagnose,
                     against=against, **tol, float32_inside=expect.float32_inside(kata))


def test_decode_equals_full_forward(learner, bugs, kata, rng, device):
    """with the cache, a prefill then tokens one at a time, or chunks, give the module's own full forward (or, where that is wrong, the right one)"""
    for (B, d, H, *dims), chunks, dtype in ((CONFIGS[0], (P, 1, 1, 1), torch.float64),
                                            (CONFIGS[1], (3, 2, 1, 3), torch.float64),
                                            (CONFIGS[0], (2, 1, 1, 3), torch.float32)):
        sd = weights(rng, d, H, *dims, dtype=dtype)
        judge_decoding(learner, bugs, kata, device, sd, H, dims, normal(rng, B, sum(chunks), d).to(dtype), chunks,
                       absorb=False)


def test_absorbed_equals_naive(learner, bugs, kata, rng, device):
    """absorb=True (W_uk folded into the query, W_uv into the output) decodes to what the naive path gives"""
    for (B, d, H, *dims), chunks, dtype in ((CONFIGS[0], (P, 1, 1, 2), torch.float64),
                                            (CONFIGS[1], (4, 1, 2), torch.float64),
                                            (CONFIGS[1], (3, 1, 1), torch.float32)):
        sd = weights(rng, d, H, *dims, dtype=dtype)
        judge_decoding(learner, bugs, kata, device, sd, H, dims, normal(rng, B, sum(chunks), d).to(dtype), chunks,
                       absorb=True)


def per_head_widths(H, nope, rope, v) -> set:
    """The widths of per-head keys and values, one head's or every head's merged: k_nope, the full
    key [k_nope ; k_rope], the value, and wkv_b's output [k_nope ; v]."""
    return {w * n for w in (nope, nope + rope, v, nope + v) for n in (1, H)}


def tensors_of(ops):
    """Every tensor a recorded call was given (arguments, keyword arguments, lists of them) and
    every matrix product's result, as (what, shape): a tensor a decoding step makes and uses is
    given to a later call, whatever call made it (a broadcast multiply, tensordot, a loop's stack)."""
    for op in ops:
        name = op.get("name")
        for arg in [*op.get("args", []), *op.get("kwargs", {}).values()]:
            for shape in shapes_in(arg):
                yield f"{shape} given to {name}", shape
        made = product(op)
        if made is not None:
            yield f"{name} -> {made[1]}", made[1]


def per_head_cached(ops, B, H, n, widths) -> list[str]:
    """The recorded tensors that hold per-head keys or values of the n cached tokens: an axis over
    the tokens (n, or n flattened with the batch, the heads or both) and another of one of
    ``widths``. The absorbed path has none: the latent scores and weights have the tokens and no
    width, the new token's keys a width and no token axis."""
    tokens = {n * k for k in (1, B, H, B * H)}
    found = []
    for what, shape in tensors_of(ops):
        token_axes = [i for i, a in enumerate(shape) if a in tokens]
        if any(a in widths for i, a in enumerate(shape) for j in token_axes if i != j) and what not in found:
            found.append(what)
    return found


def test_absorbed_never_up_projects_cache(learner, bugs, kata, rng, device):
    """absorb=True decodes in the latent space: no tensor of a decoding step holds per-head keys or values of the cached tokens"""
    B, d, H, *dims = CONFIGS[0]
    r, nope, rope, v = dims
    sd, x = weights(rng, d, H, *dims), normal(rng, B, P_ABSORBED + 3, d)
    m = build(learner, device, sd, H, dims)
    case = case_text(x, H, dims, f"out, cache = m(x[:, :{P_ABSORBED}], absorb=True), then three tokens decoded one "
                                 "at a time with absorb=True, the tensors of each step recorded")
    _, cache = decode(m, x[:, :P_ABSORBED], (P_ABSORBED,), True, device=device, case=case)
    widths = per_head_widths(H, nope, rope, v)
    for t in range(P_ABSORBED, P_ABSORBED + 3):
        call = f"m(x[:, {t}:{t + 1}], cache, absorb=True) with {t} tokens cached"
        with learner.recording() as ops:
            got = m(x[:, t:t + 1], cache, absorb=True)
        output_form(got, B=B, T=1, d=d, dtype=x.dtype, device=device, call=call, case=case)
        found = per_head_cached(ops, B, H, t + 1, widths)
        keys, values = bugs.expected.keys_and_values(sd, H, dims, x[:, :t])
        # a cache of per-head keys makes every step hold them: that mistake is the cache's
        diagnose = lambda: ("cache-holds-up-projected-keys" if cache_diagnosis(cache, keys, values, H, dims, B, t)
                            == "cache-holds-up-projected-keys" else "absorbed-up-projects-cache")
        expect.that(not found, "The absorbed path up-projects the cache: a tensor of the decoding step holds "
                    "per-head keys or values for every cached token.", call=call, case=case,
                    got="; ".join(found[:4]) + (f"; and {len(found) - 4} more" if len(found) > 4 else ""),
                    expected=f"tensors with the {t + 1} cached tokens and no per-head key or value width "
                    f"({', '.join(map(str, sorted(widths)))}): the latent c_kv ({B}, {t + 1}, {r}), scores "
                    f"({B}, {H}, 1, {t + 1}), a weighted latent ({B}, 1, {H}, {r}); W_uk applied to the query, W_uv "
                    "to the weighted latent, never to the cache", diagnose=diagnose)
        cache = got[1]
    check_untampered(learner, call="m(x_t, cache, absorb=True)", case=case)
