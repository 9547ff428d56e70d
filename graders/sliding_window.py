"""Grader of the sliding-window kata (katas/sliding-window/README.md)."""
import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.learner import Remote, describe_value
from graders.engine.recording import recorded
from graders.engine.structure import banned_used, check_untampered

B, H, D, DV = 2, 3, 4, 6   # H != head_dim, and v's width differs from k's: a k/v mix-up shows
# (Tq, Tk, window). The first has Tq < Tk and a window inside the keys: every mask bug gives
# another mask there. Then a square mask, one decoding query, a window of 1 (the query alone),
# a window wider than the keys (the causal mask) and a longer rectangle.
MASKS = [(6, 9, 3), (7, 7, 4), (1, 7, 3), (5, 8, 1), (4, 5, 9), (3, 10, 5)]
# (Tq, Tk, window, dtype) of the attention checked against the reference.
ATTENTION = [(6, 9, 3, torch.float64), (8, 8, 3, torch.float64), (1, 7, 3, torch.float64),
             (5, 8, 1, torch.float64), (4, 10, 4, torch.float32)]
# (Tq, Tk, window >= Tk): the window covers every key, so the mask is the causal mask.
COVERING = [(7, 7, 7), (7, 7, 12), (3, 8, 8), (3, 8, 20), (1, 6, 6)]
# (window, chunk sizes) of the rolling-buffer checks: one token at a time well past 2 windows;
# chunks shorter, equal to and longer than the window (a prompt's prefill in one append); and a
# window of 1, where "the window - 1 tokens before" is none (`[-0:]` is every token, not none).
DECODES = [(4, [1] * 11), (4, [3, 1, 6, 2, 1, 4]), (3, [2, 5, 1, 3, 1]), (1, [2, 1, 3, 1])]
# The memory check: head widths large enough that CUDA's 512-byte rounding is small beside a
# token, a window of 8 and a stream of 16 windows before the append that is measured.
# 16 kB a token and a stream of 32 windows: what a cache holds and makes is measured by the kernel
# (resident pages), beside which the interpreter's own few kilobytes are small.
MEMORY = {"B": 2, "H": 4, "D": 128, "DV": 128, "window": 8, "stream": 256}

QKV_CASE = "q ({B}, {H}, {Tq}, {D}), k ({B}, {H}, {Tk}, {D}), v ({B}, {H}, {Tk}, {DV}), {dtype} standard normal"


def randn(rng, *shape, dtype=torch.float64):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def qkv(rng, Tq, Tk, dtype=torch.float64, b=B, h=H, d=D, dv=DV):
    return randn(rng, b, h, Tq, d, dtype=dtype), randn(rng, b, h, Tk, d, dtype=dtype), \
        randn(rng, b, h, Tk, dv, dtype=dtype)


def qkv_case(q, k, v, about=""):
    text = QKV_CASE.format(B=q.shape[0], H=q.shape[1], Tq=q.shape[2], Tk=k.shape[2], D=q.shape[3], DV=v.shape[3],
                           dtype=str(q.dtype).removeprefix("torch."))
    return text + (f"; {about}" if about else "")


def band_case(Tq, Tk, window):
    queries = "1 query" if Tq == 1 else f"{Tq} queries"
    offset = f"i + {Tk - Tq}" if Tk > Tq else "i"
    return (f"{queries}, {Tk} keys, window {window}: query i sits at position {offset} and sees key j iff "
            f"0 <= {offset} - j < {window}")


def grid(mask) -> str:
    """A small bool mask drawn as 1s (may attend) and 0s, one row per query."""
    lines = mask.to("cpu").reshape(-1, mask.shape[-1]).int().tolist()
    return f"bool{list(mask.shape)}, one row per query, 1 = may attend:" + "".join(
        "\n    " + " ".join(map(str, line)) for line in lines)


def mask_diagnosis(got, wrong):
    """A bug named from the mask's pattern, when no oracle gives exactly this mask: a future key
    allowed, the band one key too wide or too narrow, or the queries aligned top-left. ``wrong``
    is ``bugs.expected.wrong_masks(Tq, Tk, window)``, asked for with the case rather than on
    failure, so that a bundle records it and names these bugs too."""
    future, narrower, wider, top_left = wrong
    if type(got) is not torch.Tensor or got.shape != future.shape or got.dtype != torch.bool:
        return None
    got = got.cpu()
    if bool((got & future).any()):
        return "window-not-causal"
    if torch.equal(got, narrower) or torch.equal(got, wider):
        return "window-off-by-one"
    if got.shape[0] != got.shape[1] and torch.equal(got, top_left):
        return "mask-top-left-aligned"
    return None


def check_mask(got, expected, *, call, case, diagnose, device=None):
    expect.bool_mask(got, tuple(expected.shape), call=call, case=case, device=device, what="the mask")
    wrong = got.to("cpu") != expected
    first = ", ".join(str(int(i)) for i in torch.nonzero(wrong)[0]) if wrong.any() else ""
    expect.that(not wrong.any(), f"The mask is wrong at {int(wrong.sum())} of {wrong.numel()} positions "
                f"(first at [{first}]).", call=call, case=case, got=grid(got), expected=grid(expected),
                diagnose=diagnose)


def spans(chunks):
    """(start, stop) of each chunk of a stream cut into ``chunks`` tokens at a time."""
    stops = torch.tensor(chunks).cumsum(0).tolist()
    return list(zip([0] + stops[:-1], stops))


def window_of(start, stop, window):
    """The first position of the keys the queries start..stop - 1 may see: window - 1 before start."""
    return max(0, start - (window - 1))


def stream_case(window, chunks, k, v):
    return (f"cache = RollingKVCache({window}); keys ({k.shape[0]}, {k.shape[1]}, {k.shape[2]}, {k.shape[3]}) and "
            f"values (..., {v.shape[3]}) standard normal, appended {len(chunks)} times, {chunks} tokens at a time")


@recorded
def trusted_windows(cls, k, v, window, chunks):
    """(k_win, v_win) of every append of a trusted cache (the reference or a bug oracle)."""
    cache = cls(window)
    return [cache.append(k[..., a:b, :], v[..., a:b, :]) for a, b in spans(chunks)]


@recorded
def trusted_decode(cls, attention, q, k, v, window, chunks):
    """A trusted cache and attention decoding the stream chunk by chunk: outputs (B, H, T, dv)."""
    cache = cls(window)
    outs = []
    for a, b in spans(chunks):
        k_win, v_win = cache.append(k[..., a:b, :], v[..., a:b, :])
        outs.append(attention(q[..., a:b, :], k_win, v_win, window))
    return torch.cat(outs, dim=-2)


def pair(got, *, call, case):
    expect.that(type(got) is tuple and len(got) == 2, "append must return a pair (k_win, v_win).", call=call,
                case=case, got=describe_value(got), expected="tuple (k_win (B, H, n, hd), v_win (B, H, n, dv))")


def stream_positions(got, stream, first):
    """The position in the stream of each token of ``got`` (its time axis): ``first`` plus the
    index of the token of ``stream`` it equals, in every batch row and head at once; None when a
    token is none of them, or ``got`` is not laid out as ``stream`` is."""
    if type(got) is not torch.Tensor or got.dim() != 4 or got.shape[:2] != stream.shape[:2] \
            or got.shape[-1] != stream.shape[-1]:
        return None
    got, stream = got.detach().cpu().double(), stream.double()
    found = []
    for i in range(got.shape[-2]):
        same = torch.isclose(got[..., i:i + 1, :], stream, rtol=1e-12, atol=1e-12).all(-1).flatten(0, -2).all(0)
        if not bool(same.any()):
            return None
        found.append(first + int(same.nonzero()[0]))
    return found


def window_diagnosis(got, stream, a, b, window):
    """The cache bug behind a wrong window for the stream's tokens a..b - 1, told by which stream
    positions it holds, when no oracle gives exactly this window. rolling-buffer-order: the right
    tokens, each once, in another order. rolling-buffer-overwritten: the chunk comes last, as it
    should, but what comes before it holds tokens of the chunk itself: the cache stored the chunk
    before it read the tokens before it, so those come twice and the ones they replaced are
    missing."""
    first = max(0, a - window)   # the oldest token the buffer can hold before this append
    found = stream_positions(got, stream[..., first:b, :], first)
    want = list(range(window_of(a, b, window), b))
    if found is None or found == want:
        return None
    if sorted(found) == want:
        return "rolling-buffer-order"
    t = b - a
    if len(found) > t and found[-t:] == list(range(a, b)) and any(p >= a for p in found[:-t]):
        return "rolling-buffer-overwritten"
    return None


def windows_diagnosis(bugs, got, step, k, v, window, chunks, tol):
    """The cache bug behind a wrong (k_win, v_win) at append number ``step``."""
    code = bugs.match(got, lambda impl: trusted_windows(impl.RollingKVCache, k, v, window, chunks)[step], **tol)
    if code is None and type(got) is tuple and len(got) == 2:
        a, b = spans(chunks)[step]
        code = window_diagnosis(got[0], k, a, b, window) or window_diagnosis(got[1], v, a, b, window)
    return code


def check_windows(learner, bugs, kata, rng, device, window, chunks, k=None, v=None):
    """Every append of the learner's cache returns the keys and values its queries may see, oldest
    first, and len(cache) counts the tokens."""
    T = sum(chunks)
    if k is None:
        k, v = randn(rng, B, H, T, D), randn(rng, B, H, T, DV)
    tol = kata.tolerance("float64")
    case = stream_case(window, chunks, k, v)
    cache = learner.RollingKVCache(window)
    for step, (a, b) in enumerate(spans(chunks)):
        call = f"cache.append(k[:, :, {a}:{b}], v[:, :, {a}:{b}])"
        got = cache.append(k[..., a:b, :], v[..., a:b, :])
        pair(got, call=call, case=case)
        start = window_of(a, b, window)
        brings = f"token {a}, whose query" if b - a == 1 else f"tokens {a}..{b - 1}, whose queries"
        about = f"{case}; this append brings {brings} may see tokens {start}..{b - 1}, oldest first"
        for what, value, want in (("k_win", got[0], k[..., start:b, :]), ("v_win", got[1], v[..., start:b, :])):
            expect.array(value, want, call=call, case=about, what=what, device=device, rtol=0.0, atol=0.0,
                         against=f"tokens {start}..{b - 1} of the stream",
                         diagnose=lambda: windows_diagnosis(bugs, got, step, k, v, window, chunks, tol))
        seen = expect.length(learner, cache, name="cache")
        expect.that(seen == b, "len(cache) must count the tokens appended so far.",
                    call="len(cache)", case=f"{case}; after the appends up to token {b - 1}",
                    got=describe_value(seen), expected=f"{b}")


def check_decode(learner, bugs, kata, rng, device, window, chunks, *, sizes=(B, H, D, DV)):
    """Decoding chunk by chunk through the learner's cache and attention equals the reference's
    windowed attention over the whole sequence, in float64."""
    b_, h_, d_, dv_ = sizes
    T = sum(chunks)
    q, k, v = qkv(rng, T, T, b=b_, h=h_, d=d_, dv=dv_)
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    case = (stream_case(window, chunks, k, v) + f"; each chunk's queries q[:, :, a:b] attend with "
            f"sliding_window_attention(q[:, :, a:b], k_win, v_win, {window})")
    cache = learner.RollingKVCache(window)
    outs = []
    for a, b in spans(chunks):
        call = f"cache.append(k[:, :, {a}:{b}], v[:, :, {a}:{b}])"
        got = cache.append(k[..., a:b, :], v[..., a:b, :])
        pair(got, call=call, case=case)
        call = f"sliding_window_attention(q[:, :, {a}:{b}], k_win, v_win, {window})"
        out = learner.sliding_window_attention(q[..., a:b, :], got[0], got[1], window)
        expect.form(out, torch.Tensor, (b_, h_, b - a, dv_), dtype=torch.float64, device=device, call=call, case=case,
                    what="the output")
        outs.append(out.cpu())
    got = torch.cat(outs, dim=-2)   # (B, H, T, dv)
    expected = bugs.reference.sliding_window_attention(q, k, v, window)
    expect.values(got, expected, call=f"decoding {T} tokens {chunks} at a time", case=case, **tol,
                  what="the outputs, concatenated over the chunks",
                  against=f"sliding_window_attention(q, k, v, {window}) over the whole sequence (the reference)",
                  float32_inside=expect.float32_inside(kata),
                  diagnose=lambda: bugs.match(got, lambda impl: trusted_decode(
                      impl.RollingKVCache, impl.sliding_window_attention, q, k, v, window, chunks), **loose))


def check_attention(learner, bugs, kata, device, q, k, v, window, expected, *, against, about=""):
    """The learner's sliding_window_attention(q, k, v, window) equals ``expected``."""
    tol, loose = kata.tolerance(q.dtype), kata.tolerance("float32")
    call = f"sliding_window_attention(q, k, v, {window})"
    got = learner.sliding_window_attention(q, k, v, window)
    expect.array(got, expected, call=call, case=qkv_case(q, k, v, about), what="the output", device=device,
                 against=against, **tol, float32_inside=expect.float32_inside(kata, q.dtype),
                 diagnose=lambda: bugs.match(got, lambda impl: impl.sliding_window_attention(q, k, v, window), **loose))


def test_mask_band_values(learner, bugs, kata):
    """the mask is the band 0 <= (Tk - Tq + i) - j < window: bottom-right aligned, the query and window - 1 keys before it"""
    tol = kata.tolerance("float64")
    for Tq, Tk, window in MASKS:
        wrong = bugs.expected.wrong_masks(Tq, Tk, window)
        got = learner.sliding_window_mask(Tq, Tk, window)
        check_mask(got, bugs.expected.band(Tq, Tk, window), call=f"sliding_window_mask({Tq}, {Tk}, {window})",
                   case=band_case(Tq, Tk, window),
                   diagnose=lambda: bugs.match(got, lambda impl: impl.sliding_window_mask(Tq, Tk, window), **tol)
                   or mask_diagnosis(got, wrong))


def test_mask_dtype_and_device(learner, bugs, device):
    """the mask is bool and built on `device` (a meta tensor for device="meta"; CUDA too when present)"""
    expected = bugs.expected.band(4, 6, 3)   # asked for on any device: a bundle built on a CPU records it
    call = "sliding_window_mask(5, 8, 3)"
    expect.bool_mask(learner.sliding_window_mask(5, 8, 3), (5, 8), call=call, what="the mask")
    case = "a meta tensor has a shape and a dtype but no data: it shows where the mask was built"
    for dev, text in (("meta", "'meta'"), (torch.device("meta"), "torch.device('meta')")):
        call = f"sliding_window_mask(4, 6, 3, device={text})"
        got = learner.sliding_window_mask(4, 6, 3, device=dev)
        expect.type_of(got, torch.Tensor, call=call, case=case, what="the mask")
        expect.that(got.device.type == "meta", "sliding_window_mask ignored its `device` argument.", call=call,
                    case=case, got=f"a tensor on {got.device}", expected="a tensor on meta")
        expect.bool_mask(got, (4, 6), call=call, case=case, what="the mask")
    if device == "cuda":
        got = learner.sliding_window_mask(4, 6, 3, device="cuda")
        check_mask(got, expected, call="sliding_window_mask(4, 6, 3, device='cuda')", case=band_case(4, 6, 3),
                   device="cuda", diagnose=None)


def test_window_covering_t_equals_causal(learner, bugs, kata, rng, device):
    """window >= Tk: the mask is the causal mask and the attention is causal attention (SDPA's, bottom-right aligned)"""
    tol = kata.tolerance("float64")
    for Tq, Tk, window in COVERING:
        causal, wrong = bugs.expected.causal(Tq, Tk), bugs.expected.wrong_masks(Tq, Tk, window)   # (Tq, Tk) each
        got = learner.sliding_window_mask(Tq, Tk, window)
        check_mask(got, causal, call=f"sliding_window_mask({Tq}, {Tk}, {window})",
                   case=f"{band_case(Tq, Tk, window)}; a window of {window} >= {Tk} keys covers every earlier key: "
                        "the causal mask",
                   diagnose=lambda: bugs.match(got, lambda impl: impl.sliding_window_mask(Tq, Tk, window), **tol)
                   or mask_diagnosis(got, wrong))
        q, k, v = qkv(rng, Tq, Tk)
        if Tq == Tk:
            expected, against = F.scaled_dot_product_attention(q, k, v, is_causal=True), \
                "F.scaled_dot_product_attention(q, k, v, is_causal=True)"
        else:   # is_causal=True is top-left aligned when the lengths differ: the mask is given instead
            expected, against = F.scaled_dot_product_attention(q, k, v, attn_mask=causal), \
                f"F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones({Tq}, {Tk}).tril({Tk - Tq}))"
        check_attention(learner, bugs, kata, device, q, k, v, window, expected, against=against,
                        about=f"window {window} >= Tk = {Tk}: causal attention")


def test_windowed_attention_matches(learner, bugs, kata, rng, device):
    """sliding_window_attention equals the reference (float64, and float32) and SDPA under the band mask"""
    for Tq, Tk, window, dtype in ATTENTION:
        q, k, v = qkv(rng, Tq, Tk, dtype=dtype)
        expected = bugs.reference.sliding_window_attention(q, k, v, window)
        check_attention(learner, bugs, kata, device, q, k, v, window, expected,
                        against="the reference, computed in float64", about=band_case(Tq, Tk, window))
    q, k, v = qkv(rng, 6, 9)
    # An oracle nobody here wrote.
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=bugs.expected.band(6, 9, 3))
    check_attention(learner, bugs, kata, device, q, k, v, 3, sdpa, about=band_case(6, 9, 3),
                    against="F.scaled_dot_product_attention(q, k, v, attn_mask=the band)")


def test_rejects_bad_arguments(learner):
    """window < 1, or more queries than keys, raise ValueError (or AssertionError)"""
    learner.sliding_window_mask(3, 5, 1)   # valid calls first: only the bad ones may raise
    learner.RollingKVCache(1)
    for call, make, why in (
            ("sliding_window_mask(4, 6, 0)", lambda: learner.sliding_window_mask(4, 6, 0),
             "a window of 0 would hide even the query itself"),
            ("sliding_window_mask(6, 4, 2)", lambda: learner.sliding_window_mask(6, 4, 2),
             "the queries are the last Tq of the Tk tokens: 6 queries cannot be the last of 4 keys"),
            ("RollingKVCache(0)", lambda: learner.RollingKVCache(0), "a cache for a window of 0 tokens holds nothing")):
        expect.refused(make, call=call, case=why,
                       expected="ValueError (or AssertionError): check window >= 1 and Tq <= Tk first",
                       raised="The call is invalid, but the error raised is not the expected one.",
                       returned="The call is invalid, yet it returned.")


def test_rolling_buffer_returns_window(learner, bugs, kata, rng, device):
    """append returns the keys and values the new tokens may see, oldest first (min(t, window - 1 + t_new) of them); len counts every token"""
    for window, chunks in DECODES[:2] + DECODES[3:]:
        check_windows(learner, bugs, kata, rng, device, window, chunks)


def test_rolling_buffer_equals_full_window(learner, bugs, kata, rng, device):
    """decoding through the cache, a token or a chunk at a time, equals windowed attention over the full sequence"""
    for window, chunks in DECODES[1:3] + DECODES[:1]:   # chunks first: there the order of the keys shows
        check_decode(learner, bugs, kata, rng, device, window, chunks)


def held(learner, value, depth=0, attributes=False):
    """(bytes of floating tensors, most entries in one container) reachable from ``value``, what the
    learner's cache keeps: tensors, lists, tuples and dicts as they come back; objects left in the
    sandbox (a deque, an object of the learner's) through their __dict__ (``attributes``: not a
    container) or their len()."""
    if type(value) is torch.Tensor:
        return (value.numel() * value.element_size() if value.is_floating_point() else 0), 0
    items = list(value.values()) if type(value) is dict else value if type(value) in (list, tuple) else None
    if isinstance(value, Remote) and depth < 4:
        try:
            return held(learner, learner.get(value, "__dict__"), depth + 1, attributes=True)
        except LearnerRaised:
            try:
                size = learner.get(value, "__len__")()
            except LearnerRaised:
                return 0, 0
            return 0, size if type(size) is int else 0
    if items is None or depth >= 4:
        return 0, 0
    found = [held(learner, item, depth + 1) for item in items]
    return sum(b for b, _ in found), max([0 if attributes else len(items)] + [n for _, n in found])


def test_buffer_never_exceeds_window(learner, rng, device):
    """after 32 windows of tokens, the cache keeps at most two windows of K and V, and one append creates at most four"""
    m = MEMORY
    window, T = m["window"], m["stream"]
    k, v = randn(rng, m["B"], m["H"], T, m["D"]), randn(rng, m["B"], m["H"], T, m["DV"])
    token = m["B"] * m["H"] * (m["D"] + m["DV"]) * 8   # bytes of one token's key and value, float64
    case = (f"cache = RollingKVCache({window}); {T} tokens appended (a chunk of {T - 3}, then 3 one at a time), "
            f"keys ({m['B']}, {m['H']}, t, {m['D']}), values (..., {m['DV']}), float64: {token:,} bytes a token")

    def streamed():
        cache = learner.RollingKVCache(window)
        for a, b in spans([T - 3, 1, 1, 1]):
            cache.append(k[..., a:b, :], v[..., a:b, :])
        return cache

    # A first cache runs every code path once, so that the worker's memory grows, over a second,
    # by what the second holds, wherever it holds it (tensors, NumPy arrays, a global, views that
    # keep a whole chunk alive).
    cache = streamed()
    before = learner.resident_bytes()
    streamed()
    after = learner.resident_bytes()
    grown = None if None in (before, after) else after - before
    k1, v1 = randn(rng, m["B"], m["H"], 1, m["D"]), randn(rng, m["B"], m["H"], 1, m["DV"])
    call = "cache.append(k_next, v_next)"
    peak = learner.peak_bytes(cache.append, k1, v1)
    # Reading the window - 1 tokens back and concatenating the new one copies a window or two of
    # K and V: room for four copies, and 64 KiB for the pages each new allocation rounds up to. A
    # cache that copies the stream makes 128 tokens' worth here (the stream's keys, then its
    # values, each freed in turn), three times the limit.
    limit = 4 * (window + 1) * token + (64 << 10)
    expect.that(peak is not None and peak <= limit, "One append creates more memory than a window's worth of "
                "keys and values: the cache copies every token it has seen, so it grows with the stream.",
                call=call, case=case + f"; one more token appended after {T}",
                got="no measurement" if peak is None else f"{peak:,} bytes created ({peak / token:.1f} tokens' worth)",
                expected=f"at most {limit:,} bytes (four copies of a window of {window + 1} tokens' keys and "
                         "values, and 64 KiB)", diagnose=lambda: "rolling-buffer-grows")
    try:
        state = learner.get(cache, "__dict__")
    except LearnerRaised:   # a class with __slots__ only: the measurement above is all there is
        state = None
    if state is not None:
        size, entries = held(learner, state, attributes=True)
        expect.that(size <= 2 * window * token and entries <= 2 * window,
                    f"After {T + 1} tokens, the cache still holds more than two windows of them: a rolling buffer "
                    f"keeps {window} tokens' keys and values and drops the older ones.", call="cache.__dict__",
                    case=case + "; then one more token",
                    got=f"{size:,} bytes of floating-point tensors ({size / token:.1f} tokens' worth), and a "
                        f"container of {entries} entries",
                    expected=f"at most {2 * window * token:,} bytes ({2 * window} tokens' worth) and {2 * window} "
                             "entries in any list, dict or deque", diagnose=lambda: "rolling-buffer-grows")
    # What no attribute shows (a global, a closure, NumPy, views): two windows, and 512 KiB for
    # the interpreter's own allocations (under 300 KiB here). A cache that keeps every token holds
    # 4 MiB more.
    limit = 2 * window * token + (512 << 10)
    expect.that(grown is None or grown <= limit, f"After {T} tokens, the sandbox holds more memory than two "
                "windows of them: a rolling buffer keeps a window of keys and values and lets the older ones go, "
                "however it stores them (a view of a token keeps the whole chunk it came in).",
                call="resident memory of the sandbox, as the kernel counts it",
                case=case + "; the same stream once more, into a second cache",
                got=f"{grown:,} bytes more after the second stream ({grown / token:.1f} tokens' worth)",
                expected=f"at most {limit:,} bytes ({window * 2} tokens' worth, and 512 KiB)",
                diagnose=lambda: "rolling-buffer-grows")
    check_untampered(learner, call=call, case=case)


def test_banned_api(learner, kata, rng):
    """no library attention: masks, attention and cache written with tensor operations"""
    learner.sliding_window_attention(*qkv(rng, 5, 5), 2)   # first call: lazy imports happen before recording
    q, k, v = qkv(rng, 5, 8)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    cache = learner.RollingKVCache(3)
    with learner.recording() as ops:
        learner.sliding_window_mask(5, 11, 3)   # 11 keys: a size no other call uses
        learner.sliding_window_attention(q, k, v, 3)
        for a, b in spans([3, 1]):
            k_win, v_win = cache.append(k[..., a:b, :], v[..., a:b, :])
            learner.sliding_window_attention(q[..., a:b, :], k_win, v_win, 3)
    used = banned_used(learner.source, ops, kata.banned)
    call = "sliding_window_attention(q, k, v, 3)"
    expect.that(not used, "Your code uses a library attention this kata forbids.", call=call,
                got=", ".join(used), expected="only tensor operations (matmul, masked_fill, softmax)",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call)
