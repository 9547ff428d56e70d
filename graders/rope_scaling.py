"""Grader of the rope-scaling kata (katas/rope-scaling/README.md)."""
import math

import torch

from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.learner import describe_value
from graders.engine.weights import normal

# Published configurations, so the values checked are those of real checkpoints:
# Llama 2 7B stretched by YaRN to 64K and 128K (Peng et al., 2023), Qwen2.5's YaRN config (factor 4
# over 32,768), DeepSeek-V3's decoupled RoPE key (64 dims, factor 40 over 4,096), Llama 3.1
# (head_dim 128, base 500,000, factor 8 over 8,192) and Llama 3.2 1B (head_dim 64, factor 32).
YARN_CASES = [(128, 10000.0, 16.0, 4096, None), (128, 10000.0, 32.0, 4096, None), (128, 1e6, 4.0, 32768, None),
              (64, 10000.0, 40.0, 4096, None), (32, 10000.0, 8.0, 2048, (16.0, 2.0))]
LLAMA3_CASES = [(128, 500000.0, 8.0, 8192, None), (64, 500000.0, 32.0, 8192, None), (16, 500.0, 4.0, 64, (1.5, 6.0))]
LINEAR_CASES = [(16, 10000.0, 4.0), (64, 10000.0, 2.5), (128, 500000.0, 8.0)]
NTK_CASES = [(16, 10000.0, 4.0), (128, 10000.0, 8.0), (32, 500.0, 2.5)]
# DeepSeek-V3's YaRN entry as its config.json writes it: the method under the legacy key "type" (Hugging
# Face reads it as rope_type), whole numbers where floats are meant, and mscale keys that go to its attention.
DEEPSEEK_V3_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 4096, "type": "yarn"}
# rope_scaling dicts with Hugging Face's keys; positions run past each original context.
SCALINGS = [None,
            {"rope_type": "linear", "factor": 4.0},
            {"rope_type": "ntk", "factor": 4.0},
            {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 16.0,
             "beta_slow": 2.0},
            {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 2048},
            {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 1024, "low_freq_factor": 2.0,
             "high_freq_factor": 8.0},
            DEEPSEEK_V3_YARN]
KIT_PAIRS = "pair i is (x[2i], x[2i+1]), θ_i = base^(-2i/head_dim)"


def relative(kata, dtype="float64") -> dict:
    """The dtype's rtol alone: frequencies span eight decades (1 down to 1e-8), so an absolute
    part would let the slowest pairs be off by any factor."""
    return {"rtol": kata.tolerance(dtype)["rtol"], "atol": 0.0}


def args_text(*args, **kwargs) -> str:
    shown = [f"{a:g}" if isinstance(a, float) else repr(a) for a in args]
    return ", ".join(shown + [f"{k}={v:g}" for k, v in kwargs.items()])


def frequencies(learner, bugs, kata, name, args, kwargs, expected, case):
    """learner.<name>(*args, **kwargs) is a float64 (head_dim // 2,) tensor equal to ``expected``."""
    call = f"{name}({args_text(*args, **kwargs)})"
    got = getattr(learner, name)(*args, **kwargs)
    loose = relative(kata, "float32")
    expect.array(got, expected, call=call, case=case, what="the frequencies", **relative(kata),
                 float32_inside=loose, against="the frequencies computed the published way, in float64",
                 diagnose=lambda: bugs.match(got, lambda impl: getattr(impl, name)(*args, **kwargs), **loose))
    return got


def extra(options, names):
    return {} if options is None else dict(zip(names, options))


def test_rope_inv_freq_values(learner, bugs, kata):
    """rope_inv_freq(head_dim, base) is θ_i = base^(-2i/head_dim), float64 (head_dim // 2,)"""
    for hd, base in ((16, 10000.0), (8, 500.0), (128, 500000.0)):
        args = (hd,) if base == 10000.0 else (hd, base)
        frequencies(learner, bugs, kata, "rope_inv_freq", args, {}, bugs.expected.default(hd, base),
                    f"head_dim {hd}, base {base:g}: {KIT_PAIRS}")


def test_linear_inv_freq_values(learner, bugs, kata):
    """linear_inv_freq: Position Interpolation, every frequency divided by the factor"""
    for hd, base, s in LINEAR_CASES:
        frequencies(learner, bugs, kata, "linear_inv_freq", (hd, base, s), {}, bugs.expected.default(hd, base) / s,
                    f"head_dim {hd}, base {base:g}, factor {s:g}: θ_i / {s:g}, the turn of position m/{s:g}")


def test_ntk_inv_freq_values(learner, bugs, kata):
    """ntk_inv_freq: RoPE's frequencies with the base raised to base · factor^(head_dim/(head_dim-2))"""
    for hd, base, s in NTK_CASES:
        frequencies(learner, bugs, kata, "ntk_inv_freq", (hd, base, s), {}, bugs.expected.ntk(hd, base, s),
                    f"head_dim {hd}, base {base:g}, factor {s:g}: base' = {base:g}·{s:g}^({hd}/{hd - 2})")


def test_yarn_inv_freq_values(learner, bugs, kata):
    """yarn_inv_freq: fast pairs kept, slow pairs divided by the factor, a ramp over the pair index between, as YaRN's code computes it"""
    for hd, base, s, L, betas in YARN_CASES:
        kwargs = extra(betas, ("beta_fast", "beta_slow"))
        fast, slow = betas or (32.0, 1.0)
        frequencies(learner, bugs, kata, "yarn_inv_freq", (hd, base, s, L), kwargs,
                    bugs.expected.yarn(hd, base, s, L, fast, slow),
                    f"head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}, beta_fast {fast:g}, "
                    f"beta_slow {slow:g}: pairs that turn more than {fast:g} times over {L:,} positions kept, "
                    f"fewer than {slow:g} times divided by {s:g}, a ramp linear in the pair index between "
                    "(its ends floor and ceil of the pair indices where the turns are beta_fast and beta_slow)")


def test_yarn_attention_factor_values(learner, bugs, kata):
    """yarn_attention_factor(factor) is the float 0.1·ln(factor) + 1, and 1.0 for a factor of 1 or less"""
    for s in (16.0, 4.0, 40.0, 1.0, 0.5):
        call = f"yarn_attention_factor({s:g})"
        case = "YaRN's sqrt(1/t) = 0.1·ln(s) + 1 for s > 1; a factor of 1 or less stretches nothing: 1.0"
        got = learner.yarn_attention_factor(s)
        expect.that(type(got) is float, "yarn_attention_factor must return a Python float.", call=call, case=case,
                    got=describe_value(got), expected="float (math.log, not a tensor)")
        want = bugs.expected.get_mscale(s)
        expect.values(got, want, call=call, case=case, what="the attention factor", **kata.tolerance("float64"),
                      against=f"0.1·ln({s:g}) + 1" if s > 1 else "1.0")


def test_llama3_inv_freq_values(learner, bugs, kata):
    """llama3_inv_freq: wavelengths under original/high_freq_factor kept, over original/low_freq_factor divided, blended between"""
    for hd, base, s, L, factors in LLAMA3_CASES:
        kwargs = extra(factors, ("low_freq_factor", "high_freq_factor"))
        low, high = factors or (1.0, 4.0)
        frequencies(learner, bugs, kata, "llama3_inv_freq", (hd, base, s, L), kwargs,
                    bugs.expected.apply_scaling(hd, base, s, L, low, high),
                    f"head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}, low_freq_factor {low:g}, "
                    f"high_freq_factor {high:g}: wavelengths 2π/θ_i under {L / high:g} kept, over {L / low:g} "
                    f"divided by {s:g}, between blended by smooth = ({L:,}/wavelength − {low:g}) / "
                    f"({high:g} − {low:g}) as Meta's apply_scaling does")


def band(learner, kata, name, args, kwargs, theta, rules, case):
    """The ratio of the learner's frequencies to θ_i meets each rule (pairs, ratio, what it means)."""
    call = f"{name}({args_text(*args, **kwargs)})"
    got = getattr(learner, name)(*args, **kwargs)
    expect.form(got, torch.Tensor, tuple(theta.shape), dtype=torch.float64, call=call, case=case,
                what="the frequencies")
    ratio = got.cpu() / theta   # (hd/2,)
    for pairs, want, meaning in rules:
        if pairs.any():
            index = torch.nonzero(pairs).flatten().tolist()
            which = f"pair {index[0]}" if len(index) == 1 else f"pairs {index[0]} to {index[-1]}"
            expect.values(ratio[pairs], torch.full_like(ratio[pairs], want), call=call, case=case,
                          what=f"the frequency over θ_i of {which}",
                          against=meaning, **relative(kata), float32_inside=relative(kata, "float32"))


def test_bands_as_published(learner, bugs, kata):
    """each method leaves the fast pairs as it says: Position Interpolation slows all, NTK keeps pair 0 and divides the last by the factor, YaRN keeps pairs above beta_fast turns and divides those below beta_slow, Llama 3.1 keeps wavelengths under 2,048"""
    every = lambda n: torch.ones(n, dtype=torch.bool)
    first, last = lambda n: torch.arange(n) == 0, lambda n: torch.arange(n) == n - 1
    hd, base, s = 64, 10000.0, 4.0
    theta = bugs.expected.default(hd, base)
    band(learner, kata, "linear_inv_freq", (hd, base, s), {}, theta,
         [(every(hd // 2), 1 / s, f"1/{s:g} for every pair")],
         f"head_dim {hd}, base {base:g}, factor {s:g}: Position Interpolation slows every pair alike")
    band(learner, kata, "ntk_inv_freq", (hd, base, s), {}, theta,
         [(first(hd // 2), 1.0, "1: pair 0 keeps θ_0 = 1 whatever the base"),
          (last(hd // 2), 1 / s, f"1/{s:g}: base'^(-(d-2)/d) = base^(-(d-2)/d) / {s:g}")],
         f"head_dim {hd}, base {base:g}, factor {s:g}: NTK-aware scaling keeps the fastest pair and divides the "
         "slowest by the factor")
    hd, base, s, L = 128, 10000.0, 16.0, 4096
    theta = bugs.expected.default(hd, base)
    turns = L * theta / (2 * math.pi)   # (hd/2,): full turns of each pair over the original context
    band(learner, kata, "yarn_inv_freq", (hd, base, s, L), {}, theta,
         [(turns > 32, 1.0, "1: a pair that turns more than beta_fast = 32 times is left alone"),
          (turns < 1, 1 / s, f"1/{s:g}: a pair that turns less than beta_slow = 1 time is interpolated")],
         f"head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}: turns over the original context "
         "= original · θ_i / 2π")
    hd, base, s, L = 128, 500000.0, 8.0, 8192
    theta = bugs.expected.default(hd, base)
    wavelength = 2 * math.pi / theta   # (hd/2,)
    band(learner, kata, "llama3_inv_freq", (hd, base, s, L), {}, theta,
         [(wavelength < L / 4, 1.0, "1: a wavelength under 8192/4 = 2048 is kept"),
          (wavelength > L, 1 / s, "1/8: a wavelength over 8192/1 is divided by the factor")],
         f"Llama 3.1: head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}, low_freq_factor 1, "
         "high_freq_factor 4")


def test_scaled_rope_cos_sin(learner, bugs, kata):
    """scaled_rope(positions, head_dim, base, rope_scaling, dtype) is (cos, sin) of positions · the method's frequencies, past the original context"""
    pos = [0, 1, 7, 1023, 2048, 5000, 8191, 3]
    positions = torch.tensor(pos)
    for i, scaling in enumerate(SCALINGS):
        hd, base = (16, 10000.0) if i % 2 else (32, 500.0)
        dtype = torch.float64 if i % 3 == 0 else torch.float32
        kwargs = {"rope_scaling": scaling} if scaling is not None else {}
        if dtype == torch.float64:
            kwargs["dtype"] = dtype
        shown = ", ".join(f"{k}={v!r}" if k == "rope_scaling" else "dtype=torch.float64" for k, v in kwargs.items())
        args = (positions, hd) if base == 10000.0 else (positions, hd, base)   # the default base too
        call = f"scaled_rope(positions, {hd}{'' if base == 10000.0 else f', {base:g}'}{', ' + shown if shown else ''})"
        case = (f"positions = {pos}; head_dim {hd}, base {base:g}; {str(dtype).removeprefix('torch.')}; "
                "Position Interpolation's m·L/L' is its frequencies divided by the factor: cos(m·θ_i/s)"
                + ("; DeepSeek-V3's entry as its config.json writes it, the method under 'type', the key's name "
                   "before Hugging Face renamed it rope_type" if scaling is DEEPSEEK_V3_YARN else ""))
        try:
            got = learner.scaled_rope(*args, **kwargs)
        except LearnerRaised as exc:
            if exc.type_name is None or scaling is not DEEPSEEK_V3_YARN:
                raise
            expect.fail("scaled_rope raised on a config entry that names its method under the legacy key 'type': "
                        "read `rope_scaling.get(\"rope_type\", rope_scaling.get(\"type\"))`, as Hugging Face does, "
                        "and leave the keys you do not use (mscale, mscale_all_dim) alone.",
                        call=call, case=case, got=exc.message, output=exc.output,
                        expected=f"(cos, sin) of YaRN's frequencies, each ({len(pos)}, {hd // 2})")
        expect.that(type(got) is tuple and len(got) == 2, "scaled_rope must return a pair (cos, sin).", call=call,
                    case=case, got=describe_value(got), expected=f"tuple (cos, sin), each ({len(pos)}, {hd // 2})")
        expected = bugs.expected.cos_sin(positions, hd, base, scaling, dtype)
        # Each entry is the cos or sin of a phase up to the largest position, rounded.
        tol, loose = kata.tolerance(dtype, magnitude=max(pos)), kata.tolerance("float32", magnitude=max(pos))
        diagnose = lambda: bugs.match(got, lambda impl: impl.scaled_rope(*args, **kwargs), **loose)
        for what, value, want in (("cos", got[0], expected[0]), ("sin", got[1], expected[1])):
            expect.array(value, want, call=call, case=case, what=what, diagnose=diagnose, **tol,
                         against=f"the published method's {what}, its angles in float64 rounded once",
                         float32_inside=loose if dtype == torch.float64 else None)


def test_interpolated_positions_land_on_trained_ones(learner, bugs, kata, case_rng):
    """with your scaled_rope, Position Interpolation by s at position s·m turns every pair as RoPE does at m"""
    hd, base, s = 16, 10000.0, 4.0
    trained = sorted(int(p) for p in case_rng.choice(2048, size=6, replace=False))
    stretched = [int(s) * p for p in trained]
    scaling = {"rope_type": "linear", "factor": s}
    call = f"scaled_rope({stretched}, {hd}, {base:g}, {scaling!r}, dtype=torch.float64)"
    case = (f"positions {stretched} = {s:g} × {trained}; the same head_dim and base without rope_scaling at "
            f"positions {trained}: Position Interpolation maps [0, {s:g}·L) onto the trained [0, L)")
    got = learner.scaled_rope(torch.tensor(stretched), hd, base, rope_scaling=scaling, dtype=torch.float64)
    plain = learner.scaled_rope(torch.tensor(trained), hd, base, dtype=torch.float64)
    for value in (got, plain):
        expect.that(type(value) is tuple and len(value) == 2, "scaled_rope must return a pair (cos, sin).",
                    call=call, case=case, got=describe_value(value), expected="tuple (cos, sin)")
    loose = kata.tolerance("float32", magnitude=max(stretched))
    diagnose = lambda: bugs.match(got, lambda impl: impl.scaled_rope(torch.tensor(stretched), hd, base,
                                                                     rope_scaling=scaling, dtype=torch.float64),
                                  **loose)
    for what, value, want in (("cos", got[0], plain[0]), ("sin", got[1], plain[1])):
        expect.array(value, want, call=call, case=case, what=f"the {what} at the stretched positions",
                     against=f"your scaled_rope's {what} at the trained positions, without scaling", diagnose=diagnose,
                     **kata.tolerance("float64", magnitude=max(stretched)), float32_inside=loose)


def test_unknown_rope_type_refused(learner):
    """a rope_type the kata does not name, or a rope_scaling that names no method, raises ValueError (or AssertionError), never a silent default"""
    learner.scaled_rope(torch.arange(4), 8)   # a valid call first: only the unknown type may raise
    scaling = {"rope_type": "longrope", "factor": 4.0}
    expect.refused(lambda: learner.scaled_rope(torch.arange(4), 8, rope_scaling=scaling),
                   call=f"scaled_rope(torch.arange(4), 8, rope_scaling={scaling!r})",
                   case="rope_type 'longrope': not one of default, linear, ntk, yarn, llama3",
                   expected="ValueError (or AssertionError) naming the unknown rope_type",
                   raised="An unknown rope_type failed somewhere inside instead of being refused: check it first.",
                   returned="An unknown rope_type came back with a result: a silent default hides a typo in a config.")
    scaling = {"factor": 4.0, "original_max_position_embeddings": 2048}
    expect.refused(lambda: learner.scaled_rope(torch.arange(4), 8, rope_scaling=scaling),
                   call=f"scaled_rope(torch.arange(4), 8, rope_scaling={scaling!r})",
                   case="neither rope_type nor its legacy name type: the dict names no method",
                   expected="ValueError (or AssertionError) saying that no method is named",
                   raised="A rope_scaling without rope_type or type failed somewhere inside instead of being refused: "
                          "look for the method under both keys, and refuse the dict when neither is there.",
                   returned="A rope_scaling that names no method came back with a result: a silent default drops "
                            "the factor it gives.")


def judge_attention(learner, bugs, kata, rng, device, B, H, T, hd, pos, scaling, factor, dtype):
    """rope_attention of fresh q, k, v at ``pos`` under ``scaling`` with ``factor`` equals the expected."""
    q, k, v = (normal(rng, B, H, T, hd).to(dtype) for _ in range(3))
    cos, sin = bugs.expected.cos_sin(torch.tensor(pos), hd, 10000.0, scaling, torch.float64)
    cos, sin = cos.to(dtype), sin.to(dtype)
    call = f"rope_attention(q, k, v, cos, sin{'' if factor is None else f', {factor:g}'})"
    case = (f"q, k, v: {str(dtype).removeprefix('torch.')} ({B}, {H}, {T}, {hd}), standard normal; cos, sin of "
            f"positions {pos} under rope_scaling={scaling!r}; {KIT_PAIRS}; causal; logits q·k/sqrt({hd})"
            + ("" if factor is None else f" times {factor:g}² (YaRN's 1/t)"))
    args = (q, k, v, cos, sin) + (() if factor is None else (factor,))
    got = learner.rope_attention(*args)
    tol = kata.tolerance(dtype)
    expect.array(got, bugs.expected.attention(q, k, v, cos, sin, 1.0 if factor is None else factor), call=call,
                 case=case, what="the output", device=device, **tol, float32_inside=expect.float32_inside(kata, dtype),
                 against="q and k rotated as complex numbers, through F.scaled_dot_product_attention(is_causal=True, "
                         "scale=factor²/sqrt(head_dim))",
                 diagnose=lambda: bugs.match(got, lambda impl: impl.rope_attention(*args), **kata.tolerance("float32")))


def test_rope_attention_values(learner, bugs, kata, rng, device):
    """rope_attention(q, k, v, cos, sin, attention_factor) is causal attention of q and k rotated, the logits times attention_factor²"""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256}
    s = bugs.expected.get_mscale(16.0)
    for pos, scaling, factor, dtype in (([0, 1, 2, 3, 4, 5, 6], None, None, torch.float64),
                                        ([3000, 3001, 3002, 3003, 3004, 3005], yarn, s, torch.float64),
                                        ([900, 901, 902, 903, 904], yarn, 1.5, torch.float32)):
        judge_attention(learner, bugs, kata, rng, device, 2, 3, len(pos), 8, pos, scaling, factor, dtype)


def test_temperature_scales_the_logits(learner, bugs, kata, rng):
    """with your rope_attention, the attention factor acts on the logits only: v = 1 gives 1, and a factor m equals q times m² at factor 1"""
    B, H, T, hd, m = 2, 2, 6, 8, 1.25
    cos, sin = bugs.expected.cos_sin(torch.arange(100, 100 + T), hd, 10000.0, None, torch.float64)
    q, k, v = (normal(rng, B, H, T, hd) for _ in range(3))
    ones = torch.ones(B, H, T, hd, dtype=torch.float64)
    case = (f"q, k, v: float64 ({B}, {H}, {T}, {hd}), standard normal; cos, sin of positions 100..{100 + T - 1}; "
            f"attention_factor {m:g}")
    tol, loose = kata.tolerance("float64"), kata.tolerance("float32")
    call = f"rope_attention(q, k, torch.ones_like(v), cos, sin, {m:g})"
    got = learner.rope_attention(q, k, ones, cos, sin, m)
    expect.array(got, ones, call=call, case=case, what="the output", **tol, float32_inside=loose,
                 against="all ones: each query's weights sum to 1, whatever the temperature",
                 diagnose=lambda: bugs.match(got, lambda impl: impl.rope_attention(q, k, ones, cos, sin, m), **loose))
    call = f"rope_attention(q, k, v, cos, sin, {m:g}) against rope_attention(q * {m:g}**2, k, v, cos, sin, 1.0)"
    got = learner.rope_attention(q, k, v, cos, sin, m)
    sharper = learner.rope_attention(q * m ** 2, k, v, cos, sin, 1.0)
    expect.array(got, sharper, call=call, case=case, what="the output with the factor", **tol, float32_inside=loose,
                 against=f"your output with q scaled by {m:g}² and no factor: 1/t multiplies q·k",
                 diagnose=lambda: bugs.match(got, lambda impl: impl.rope_attention(q, k, v, cos, sin, m), **loose))
