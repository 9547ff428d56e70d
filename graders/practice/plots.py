"""`kata plot`: the picture that teaches a kata, drawn from the learner's own code.

A kata's manifest lists its plots (``plots = ["heatmaps"]``). For each one, a data function runs
the learner's code in the kit's sandbox, through the same ``Learner`` proxy the graders use, and
returns plain values (lists, arrays); a draw function turns those into a matplotlib figure here,
in the trusted process. Every value that comes back is checked first, so a stub, an exception, a
wrong shape or a NaN becomes one clear ``PlotFailed`` message and no file.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from ..engine.failures import CheckFailed
from ..engine.learner import Learner, call_text, describe_value
from ..engine.manifest import Kata
from ..engine.runner import resolve_device, sandbox_for
from ..engine.sandbox import Zygote
from ..engine.weights import inject, normal

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DPI = 150
SENTENCE = "the cat sat on the mat because it was tired".split()
PADDED_LENGTH = 7             # the causal-mask padding panel: the last 3 tokens are padding
D_KS = [2**i for i in range(11)]   # 1 ... 1024
SCALES = {"none": "s = 1", "sqrt": "s = √d_k", "linear": "s = d_k"}
N_KEYS = 16
N_SAMPLES, N_TRIALS = 4_000, 500   # Monte-Carlo sizes: a few percent of noise, a second in all
MIN_T, MAX_T = 64, 2048
COMPLEXITY_D_MODEL, COMPLEXITY_HEADS = 64, 4


class PlotFailed(Exception):
    """The learner's code failed while the plot's data was computed; the message says what."""


def not_png(path: Path) -> bool:
    """True when ``path`` holds something that is not a PNG image: the learner's, never replaced."""
    if not path.exists():
        return False
    if not path.is_file():
        return True
    with open(path, "rb") as f:
        return f.read(len(PNG_MAGIC)) != PNG_MAGIC


def compute(kata: Kata, kind: str, file: Path, *, seed: int = 0, device: str = "auto", max_t: int = MAX_T,
            zygote: Zygote | None = None) -> dict:
    """Run ``file`` in a sandbox (forked from ``zygote`` when given) and return the data plot
    ``kind`` of ``kata`` is drawn from.

    Raises PlotFailed when the learner's code fails, RunnerError when the kit cannot run here."""
    data_of, _ = PLOTS[kata.slug, kind]
    device = resolve_device(kata, device)
    with sandbox_for(kata, file, device=device, zygote=zygote) as sandbox:
        try:
            data = data_of(Learner(sandbox, device=device, seed=seed), seed=seed, device=device, max_t=max_t)
        except CheckFailed as exc:
            raise PlotFailed(f"{exc.text()}\nNo plot was written: `kata check {kata.slug}` says what is wrong.") from None
    return {"kata": kata.slug, "kind": kind, "device": device, **data}


def draw(data: dict):
    """The figure of ``data`` (what ``compute`` returned), on an Agg canvas: no display needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    _, draw_of = PLOTS[data["kata"], data["kind"]]
    figure = draw_of(data)
    FigureCanvasAgg(figure)
    return figure


def save(figure, out: Path):
    """Write ``figure`` as a PNG at ``out``, whole or not at all (a temporary file, then a rename).
    Raises FileExistsError, writing nothing, when ``out`` holds something that is not a PNG."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            figure.savefig(f, format="png", dpi=DPI)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes it private; a picture is not
        if not_png(out):
            raise FileExistsError(f"{out} exists and is not a PNG image: it is left alone.")
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


# --- checking what came back ------------------------------------------------------------------

def _fail(message: str, *, call: str, got: str, expected: str):
    raise CheckFailed(message, call=call, got=got, expected=expected)


def _number(member, *args, **kwargs) -> float:
    """``member(*args, **kwargs)``, which must return a finite real number."""
    value = member(*args, **kwargs)
    call = call_text(member._label, args, kwargs)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        _fail("The result is not a number.", call=call, got=describe_value(value), expected="a float")
    if not math.isfinite(value):
        _fail("The result is not finite.", call=call, got=repr(float(value)), expected="a finite float")
    return float(value)


def _tensor(value, shape: tuple, *, call: str, dtype=None, what: str = "The result"):
    """``value`` is a plain tensor of ``shape`` (and ``dtype``), with finite values."""
    import torch

    if type(value) is not torch.Tensor:
        _fail(f"{what} is not a tensor.", call=call, got=describe_value(value), expected=f"a tensor of shape {shape}")
    if tuple(value.shape) != shape or (dtype is not None and value.dtype != dtype):
        _fail(f"{what} has the wrong shape or dtype.", call=call, got=describe_value(value),
              expected=f"{str(dtype or value.dtype).removeprefix('torch.')}{list(shape)}")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        _fail(f"{what} holds NaN or infinite values.", call=call, got=f"{int((~torch.isfinite(value)).sum())} "
              f"non-finite of {value.numel()}", expected="finite values")
    return value


def _pair(value, *, call: str):
    if type(value) is not tuple or len(value) != 2:
        _fail("The call must return a pair (out, weights).", call=call, got=describe_value(value),
              expected="tuple (out, weights)")
    return value


# --- inputs drawn in the kit's process ----------------------------------------------------------

def _finish(figure, curve, title: str):
    """A heatmap-and-curve figure's last touches: the curve's grid, legend and title size, the
    figure's title."""
    curve.grid(True, alpha=0.3)
    curve.title.set_fontsize(10)
    curve.legend(fontsize=8)
    figure.suptitle(title)
    return figure


def embeddings(seed: int, d_model: int):
    """(T, d_model) float32: one standard normal vector per distinct word of SENTENCE, so a word
    that appears twice ("the") is the same input both times."""
    import torch

    vocabulary = sorted(set(SENTENCE))
    table = np.random.default_rng(seed).standard_normal((len(vocabulary), d_model))   # (V, C)
    return torch.tensor(table[[vocabulary.index(w) for w in SENTENCE]], dtype=torch.float32)   # (T, C)


# --- scaling-variance: curves -------------------------------------------------------------------

def curves_data(learner: Learner, *, seed: int, **_) -> dict:
    """score_std, sample_score_std and mean_max_weight for every d_k in D_KS and every scale."""
    data = {"d_k": D_KS, "n_keys": N_KEYS, "n_samples": N_SAMPLES, "n_trials": N_TRIALS,
            "score_std": {}, "sample_score_std": {}, "mean_max_weight": {}}
    for scale in SCALES:
        data["score_std"][scale] = [_number(learner.score_std, d, scale) for d in D_KS]
        data["sample_score_std"][scale] = [_number(learner.sample_score_std, d, scale, n_samples=N_SAMPLES, seed=seed)
                                           for d in D_KS]
        data["mean_max_weight"][scale] = [_number(learner.mean_max_weight, d, n_keys=N_KEYS, scale=scale,
                                                  n_trials=N_TRIALS, seed=seed) for d in D_KS]
    return data


def draw_curves(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    spread, softmax = figure.subplots(1, 2)
    colours = dict(zip(SCALES, ("tab:red", "tab:green", "tab:blue")))
    for scale, formula in SCALES.items():
        spread.plot(data["d_k"], data["score_std"][scale], color=colours[scale], label=f"{scale}: {formula}")
        spread.plot(data["d_k"], data["sample_score_std"][scale], "o", color=colours[scale], markersize=5)
        softmax.plot(data["d_k"], data["mean_max_weight"][scale], "o-", color=colours[scale],
                     label=f"{scale}: {formula}")
    spread.plot([], [], "o", color="grey", label=f"sample_score_std ({data['n_samples']:,} samples)")
    spread.set(xscale="log", yscale="log", xlabel="d_k (dimensions of q and k)", ylabel="std of q·k / s",
               title="Score spread: score_std (lines), sampled (markers)")
    n = data["n_keys"]
    softmax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="1: one-hot (saturated)")
    softmax.axhline(1 / n, color="black", linestyle=":", linewidth=1, label=f"1/{n}: uniform")
    softmax.set(xscale="log", ylim=(0, 1.05), xlabel="d_k (dimensions of q and k)",
                ylabel="mean of the largest softmax weight",
                title=f"Softmax over {n} keys: mean_max_weight ({data['n_trials']:,} trials)")
    for ax in (spread, softmax):
        ax.set_xticks(data["d_k"], [str(d) for d in data["d_k"]])
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle("scaling-variance, from your code: only \"sqrt\" keeps the scores at std 1 "
                    "and the softmax away from one-hot and uniform")
    return figure


# --- causal-mask, mha and cross-attention: heatmaps ---------------------------------------------

def causal_heatmaps_data(learner: Learner, *, seed: int, device: str, **_) -> dict:
    """The weights of the learner's masked_attention under their own causal_mask, for a few heads
    of q/k/v projections drawn here; and, for the first head, under causal AND padding masks."""
    import torch

    T, C, H, hd = len(SENTENCE), 16, 3, 8
    x = embeddings(seed, C)   # (T, C)
    rng = np.random.default_rng(seed + 1)
    # W ~ N(0, 1/C) keeps q and k at unit variance, so the scaled scores are O(1) and the
    # softmax neither saturates nor flattens.
    w_q, w_k, w_v = (torch.tensor(rng.standard_normal((H, C, hd)) / math.sqrt(C), dtype=torch.float32) for _ in range(3))
    q, k, v = (x @ w for w in (w_q, w_k, w_v))   # (H, T, hd) each
    call = f"causal_mask({T})"
    mask = _tensor(learner.causal_mask(T), (T, T), dtype=torch.bool, call=call)
    call = f"masked_attention(q, k, v, mask=causal_mask({T})) with q, k, v float32[{H}, {T}, {hd}]"
    weights = _tensor(_pair(learner.masked_attention(q, k, v, mask=mask), call=call)[1], (H, T, T),
                      call=call, what="The weights")
    call = f"padding_mask(tensor([{PADDED_LENGTH}]), {T})"
    padding = _tensor(learner.padding_mask(torch.tensor([PADDED_LENGTH]), T), (1, 1, 1, T), dtype=torch.bool, call=call)
    call = (f"masked_attention(q, k, v, mask=causal_mask({T}) & padding_mask(tensor([{PADDED_LENGTH}]), {T})) "
            f"with q, k, v float32[1, 1, {T}, {hd}]")
    padded = _tensor(_pair(learner.masked_attention(q[None, :1], k[None, :1], v[None, :1], mask=mask & padding),
                           call=call)[1], (1, 1, T, T), call=call, what="The weights")
    panels = [{"title": f"head {h + 1}: causal", "weights": weights[h].double().cpu().numpy()} for h in range(H)]
    panels.append({"title": f"head 1: causal AND padding\n(length {PADDED_LENGTH}: the last {T - PADDED_LENGTH} are padding)",
                   "weights": padded[0, 0].double().cpu().numpy()})
    return {"tokens": SENTENCE, "panels": panels,
            "title": "causal-mask, from your masked_attention: each query (row) attends to itself and earlier keys only"}


def mha_layout(C: int) -> dict:
    """The mha kata's parameters (KATAS.md): one fused QKV projection and the output's, with bias."""
    return {"qkv_proj.weight": (3 * C, C), "qkv_proj.bias": (3 * C,), "out_proj.weight": (C, C), "out_proj.bias": (C,)}


def state_dict(rng, layout: dict) -> dict:
    """float32 weights of ``layout`` to inject: W ~ N(0, 1/fan_in) keeps q, k and v at unit
    variance whatever the widths, so what each head attends to is the code's doing, not the scale's."""
    return {name: normal(rng, *shape, std=shape[1] ** -0.5 if len(shape) == 2 else 0.5).float()
            for name, shape in layout.items()}


def mha_module(learner: Learner, device: str, sd: dict, H: int):
    C = sd["out_proj.weight"].shape[0]
    return inject(learner, learner.MultiHeadSelfAttention(C, H), sd, device=device,
                  call=f"MultiHeadSelfAttention({C}, {H})",
                  problem="The module lacks the parameters the plot injects its weights into.",
                  hint=" (self.qkv_proj = nn.Linear(d_model, 3 * d_model); self.out_proj = nn.Linear(d_model, d_model))")


def mha_heatmaps_data(learner: Learner, *, seed: int, device: str, **_) -> dict:
    """The per-head weights of the learner's MultiHeadSelfAttention (weights injected, causal)."""
    T, C, H = len(SENTENCE), 16, 4
    module = mha_module(learner, device, state_dict(np.random.default_rng(seed + 1), mha_layout(C)), H)
    call = f"MultiHeadSelfAttention({C}, {H})(x, causal=True) with x float32[1, {T}, {C}], weights injected"
    out, weights = _pair(module(embeddings(seed, C)[None], causal=True), call=call)
    _tensor(out, (1, T, C), call=call, what="The output")
    weights = _tensor(weights, (1, H, T, T), call=call, what="The weights")
    panels = [{"title": f"head {h + 1}", "weights": weights[0, h].double().cpu().numpy()} for h in range(H)]
    return {"tokens": SENTENCE, "panels": panels,
            "title": f"mha, from your MultiHeadSelfAttention ({H} heads, causal): what each head attends to"}


TARGET = "the cat sat on the mat".split()
SOURCE = "le chat s'est assis sur le tapis".split()
SOURCE_PADDING = 2   # the source batch is padded to len(SOURCE) + 2 keys


def cross_heatmaps_data(learner: Learner, *, seed: int, device: str, **_) -> dict:
    """The per-head weights of the learner's cross-attention (weights injected): the target's words
    attend to a padded source, under the source's padding mask only."""
    import torch

    C, H, kdim, vdim = 24, 3, 12, 10
    keys = SOURCE + ["<pad>"] * SOURCE_PADDING
    Tq, Tk = len(TARGET), len(keys)
    rng = np.random.default_rng(seed + 1)
    layout = {"q_proj.weight": (C, C), "q_proj.bias": (C,), "k_proj.weight": (C, kdim), "k_proj.bias": (C,),
              "v_proj.weight": (C, vdim), "v_proj.bias": (C,), "out_proj.weight": (C, C), "out_proj.bias": (C,)}
    module = inject(learner, learner.MultiHeadAttention(C, H, kdim=kdim, vdim=vdim), state_dict(rng, layout),
                    device=device, call=f"MultiHeadAttention({C}, {H}, kdim={kdim}, vdim={vdim})",
                    problem="The module lacks the parameters the plot injects its weights into.",
                    hint=" (k_proj = nn.Linear(kdim, d_model), v_proj = nn.Linear(vdim, d_model), with bias)")
    query, key, value = (normal(rng, 1, T, width).float()   # (1, T, width)
                         for T, width in ((Tq, C), (Tk, kdim), (Tk, vdim)))
    padding = torch.arange(Tk)[None] < len(SOURCE)   # (1, Tk): True = a real source token
    call = (f"MultiHeadAttention({C}, {H}, kdim={kdim}, vdim={vdim})(query, key, value, key_padding_mask) "
            f"with query float32[1, {Tq}, {C}], key float32[1, {Tk}, {kdim}], value float32[1, {Tk}, {vdim}], "
            f"the last {SOURCE_PADDING} keys padding")
    out, weights = _pair(module(query, key, value, key_padding_mask=padding), call=call)
    _tensor(out, (1, Tq, C), call=call, what="The output")
    weights = _tensor(weights, (1, H, Tq, Tk), call=call, what="The weights")
    panels = [{"title": f"head {h + 1}", "weights": weights[0, h].double().cpu().numpy()} for h in range(H)]
    return {"tokens": TARGET, "key_tokens": keys, "panels": panels,
            "title": f"cross-attention, from your MultiHeadAttention ({H} heads): {Tq} target queries on {Tk} source keys\n"
                     "no causal triangle; the source's padding keys (grey) get weight 0"}


def draw_heatmaps(data: dict):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    tokens, panels = data["tokens"], data["panels"]
    keys = data.get("key_tokens", tokens)   # cross-attention: the keys are another sentence
    figure = Figure(figsize=(3.6 * len(panels) + 1.2, 5.4), layout="constrained")
    axes = figure.subplots(1, len(panels), sharey=True)
    # Exact zeros (what a mask leaves) in grey, so "masked" and "barely attended" look different.
    colours = colormaps["viridis"].with_extremes(bad="#d9d9d9")
    for ax, panel in zip(axes, panels):
        image = ax.imshow(np.ma.masked_equal(panel["weights"], 0.0), vmin=0.0, vmax=1.0, cmap=colours)
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xticks(range(len(keys)), keys, rotation=90)
        ax.set_yticks(range(len(tokens)), tokens)
        ax.set_xlabel("key (attended to)")
    axes[0].set_ylabel("query (attending)")
    figure.colorbar(image, ax=list(axes), label="attention weight (rows sum to 1; grey: exactly 0)", shrink=0.9)
    figure.suptitle(data["title"])
    return figure


# --- mha: complexity ----------------------------------------------------------------------------

def lengths(max_t: int) -> list[int]:
    """MIN_T, 2·MIN_T, ... up to max_t: T doubling."""
    return [MIN_T * 2**i for i in range(int(math.log2(max_t / MIN_T)) + 1)]


def complexity_data(learner: Learner, *, seed: int, device: str, max_t: int = MAX_T) -> dict:
    """Time and peak memory of the learner's forward (B=1, causal, no grad) as T doubles, beside
    the kit's SDPA attention on the same weights, both measured in the same sandbox process."""
    import torch

    C, H = COMPLEXITY_D_MODEL, COMPLEXITY_HEADS
    rng = np.random.default_rng(seed)
    sd = state_dict(rng, mha_layout(C))
    module = mha_module(learner, device, sd, H)
    sdpa = learner.kit_function("sdpa_self_attention")
    weights = [sd[k] for k in ("qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias")]

    # The two curves compare one function computed two ways: make sure it is the same function.
    x = torch.tensor(rng.standard_normal((1, MIN_T, C)), dtype=torch.float32)   # (1, T, C)
    call = f"MultiHeadSelfAttention({C}, {H})(x, causal=True) with x float32[1, {MIN_T}, {C}], weights injected"
    out = _tensor(_pair(module(x, causal=True), call=call)[0], (1, MIN_T, C), call=call, what="The output")
    expected = _tensor(sdpa(x, *weights, H, causal=True), (1, MIN_T, C), call="the kit's sdpa_self_attention")
    error = float((out.double() - expected.double()).abs().max())
    if error > 1e-4:
        _fail("Your module's output differs from F.scaled_dot_product_attention's on the same weights, "
              "so the two curves would not measure the same attention.", call=call,
              got=f"largest difference {error:.3g}", expected="at most 1e-4")

    series = {"learner": {"seconds": [], "peak_bytes": []}, "sdpa": {"seconds": [], "peak_bytes": []}}
    for T in lengths(max_t):
        x = torch.tensor(rng.standard_normal((1, T, C)), dtype=torch.float32)   # (1, T, C)
        for name, member, args in (("learner", module, (x,)), ("sdpa", sdpa, (x, *weights, H))):
            # More repeats where a call is short: the same few tenths of a second per point.
            timed = learner.measure(member, *args, causal=True, repeats=max(3, 8192 // T))
            series[name]["seconds"].append(timed["seconds"])
            peak = learner.tensor_peak_bytes(member, *args, causal=True)
            if peak is None or peak <= 0:
                _fail("The peak memory of the forward could not be measured.", call=call_text(member._label, args, {}),
                      got=describe_value(peak), expected="a positive number of bytes")
            series[name]["peak_bytes"].append(peak)
    return {"T": lengths(max_t), "d_model": C, "n_heads": H, **series}


def draw_complexity(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    time_ax, memory_ax = figure.subplots(1, 2)
    T = np.array(data["T"], dtype=float)
    for ax, key, scale, unit in ((time_ax, "seconds", 1e3, "time per forward (ms)"),
                                 (memory_ax, "peak_bytes", 2.0**-20, "peak memory of the forward (MiB)")):
        mine = np.array(data["learner"][key]) * scale
        theirs = np.array(data["sdpa"][key]) * scale
        ax.plot(T, mine, "o-", color="tab:red", label="your MultiHeadSelfAttention")
        ax.plot(T, theirs, "s-", color="tab:blue", label="F.scaled_dot_product_attention")
        # Guides through the last point of each curve: that is where the leading term dominates.
        ax.plot(T, mine[-1] * (T / T[-1]) ** 2, "--", color="grey", label="O(T²)")
        ax.plot(T, theirs[-1] * (T / T[-1]), ":", color="grey", label="O(T)")
        ax.set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel=unit)
        ax.set_xticks(T, [str(int(t)) for t in T])
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    time_ax.set_title("Time: one forward, no grad")
    memory_ax.set_title("Peak memory: the (B, H, T, T) scores grow as T²")
    figure.suptitle(f"mha, measured on {data['device']}: your module against SDPA on the same weights "
                    f"(B=1, d_model={data['d_model']}, {data['n_heads']} heads, causal, float32)")
    return figure


# --- positional-encoding: encodings -------------------------------------------------------------

PE_T, PE_D = 128, 64   # positions and width of the table drawn: pairs from 2π to ~2π·7500 positions


def encodings_data(learner: Learner, **_) -> dict:
    """The learner's sinusoidal(PE_T, PE_D) table, and PE[p] · PE[p + k] for every offset k up to
    PE_T / 2 at every position p that has a partner k further on."""
    import torch

    call = f"sinusoidal({PE_T}, {PE_D})"
    table = _tensor(learner.sinusoidal(PE_T, PE_D), (PE_T, PE_D), call=call, what="The table").double().cpu()
    offsets = PE_T // 2
    # dots[p, k] = PE[p] · PE[p + k] for p = 0..PE_T - 1 - offsets and k = 0..offsets
    dots = torch.stack([(table[:PE_T - offsets] * table[k:PE_T - offsets + k]).sum(-1)
                        for k in range(offsets + 1)], dim=-1)   # (P, K)
    return {"T": PE_T, "d": PE_D, "table": table.numpy(), "offsets": list(range(offsets + 1)),
            "positions": PE_T - offsets, "mean": dots.mean(0).numpy(), "low": dots.amin(0).numpy(),
            "high": dots.amax(0).numpy()}


def draw_encodings(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    heatmap, curve = figure.subplots(1, 2)
    image = heatmap.imshow(data["table"], aspect="auto", cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
    heatmap.set(xlabel="dimension (even: sin, odd: cos; pair i has wavelength 2π·10000^(2i/d))",
                ylabel="position p", title=f"sinusoidal({data['T']}, {data['d']})")
    figure.colorbar(image, ax=heatmap, label="PE[p, dimension]", shrink=0.9)
    k = np.array(data["offsets"])
    curve.fill_between(k, data["low"], data["high"], color="tab:blue", alpha=0.3,
                       label=f"lowest to highest over p = 0..{data['positions'] - 1}")
    curve.plot(k, data["mean"], color="tab:blue", label="mean over p of PE[p] · PE[p + k]")
    curve.axhline(data["d"] / 2, color="black", linestyle=":", linewidth=1, label=f"d/2 = {data['d'] // 2}: k = 0")
    curve.set(xlabel="offset k", ylabel="PE[p] · PE[p + k]",
              title="PE[p] · PE[p + k]: a line, not a band, if p does not matter")
    return _finish(figure, curve, "positional-encoding, from your sinusoidal: slow pairs to the right, "
                   "and a dot product that only the distance decides")


# --- flash-tiling: memory -----------------------------------------------------------------------

FLASH_HEADS, FLASH_HEAD_DIM, FLASH_BLOCK = 4, 64, 64


def flash_memory_data(learner: Learner, *, seed: int, device: str, max_t: int = MAX_T, **_) -> dict:
    """Peak memory of the learner's flash_attention (B=1, not causal, fixed tiles) as T doubles,
    beside the kit's naive attention that builds the (T, T) scores, both measured in the same
    sandbox process on the same q, k, v."""
    import torch

    H, hd, block = FLASH_HEADS, FLASH_HEAD_DIM, FLASH_BLOCK
    rng = np.random.default_rng(seed)
    naive = learner.kit_function("naive_attention")

    def qkv(T):
        return [torch.tensor(rng.standard_normal((1, H, T, hd)), dtype=torch.float32)   # (1, H, T, hd)
                for _ in range(3)]

    # The two curves compare one function computed two ways: make sure it is the same function.
    q, k, v = qkv(MIN_T)
    call = f"flash_attention(q, k, v, block_q={block}, block_k={block}) with q, k, v float32[1, {H}, {MIN_T}, {hd}]"
    out = _tensor(_pair(learner.flash_attention(q, k, v, block_q=block, block_k=block), call=call)[0],
                  (1, H, MIN_T, hd), call=call, what="The output")
    expected = _tensor(naive(q, k, v), (1, H, MIN_T, hd), call="the kit's naive_attention")
    error = float((out.double() - expected.double()).abs().max())
    if error > 1e-4:
        _fail("Your flash_attention's output differs from naive attention's on the same q, k, v, so the two "
              "curves would not measure the same attention.", call=call, got=f"largest difference {error:.3g}",
              expected="at most 1e-4")

    series = {"learner": [], "naive": []}
    for T in lengths(max_t):
        q, k, v = qkv(T)
        for name, member, kwargs in (("learner", learner.flash_attention, {"block_q": block, "block_k": block}),
                                     ("naive", naive, {})):
            peak = learner.tensor_peak_bytes(member, q, k, v, **kwargs)
            if peak is None or peak <= 0:
                _fail("The peak memory of the call could not be measured.",
                      call=call_text(member._label, (q, k, v), kwargs), got=describe_value(peak),
                      expected="a positive number of bytes")
            series[name].append(peak)
    return {"T": lengths(max_t), "n_heads": H, "head_dim": hd, "block": block, **series}


def draw_flash_memory(data: dict):
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    memory_ax, ratio_ax = figure.subplots(1, 2)
    T = np.array(data["T"], dtype=float)
    mine, naive = np.array(data["learner"], dtype=float), np.array(data["naive"], dtype=float)
    memory_ax.plot(T, mine / 2**20, "o-", color="tab:red", label="your flash_attention")
    memory_ax.plot(T, naive / 2**20, "s-", color="tab:blue", label="naive: the (T, T) scores built")
    # Guides through the last point of each curve: that is where the leading term dominates.
    memory_ax.plot(T, naive[-1] / 2**20 * (T / T[-1]) ** 2, "--", color="grey", label="O(T²)")
    memory_ax.plot(T, mine[-1] / 2**20 * (T / T[-1]), ":", color="grey", label="O(T)")
    memory_ax.set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel="peak memory of one call (MiB)",
                  title="Peak memory: the tiles stay the same size, the scores grow as T²")
    ratio_ax.plot(T, naive / mine, "o-", color="tab:purple", label="naive / yours")
    ratio_ax.axhline(1.0, color="black", linestyle=":", linewidth=1, label="1: the same memory")
    ratio_ax.set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel="naive peak / your peak",
                 title="How many times less memory the tiles take (grows as T)")
    for ax in (memory_ax, ratio_ax):
        ax.minorticks_off()
        ax.set_xticks(T, [str(int(t)) for t in T])
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    ratios = naive / mine
    ratio_ax.set_yticks([2.0**i for i in range(math.floor(math.log2(min(ratios.min(), 1.0))),
                                               math.ceil(math.log2(max(ratios.max(), 1.0))) + 1)])
    ratio_ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
    figure.suptitle(f"flash-tiling, measured on {data['device']}: your flash_attention against naive attention "
                    f"(B=1, {data['n_heads']} heads, head_dim={data['head_dim']}, blocks of {data['block']}, "
                    "not causal, float32)")
    return figure


# --- sliding-window: band -----------------------------------------------------------------------

BAND_T, BAND_WINDOW, BAND_QUERIES, BAND_LAYERS = 16, 4, 5, 3   # the heatmaps
REACH_T, REACH_LAYERS = 64, 12   # the receptive-field curve: long enough that it never reaches the start


def band_data(learner: Learner, **_) -> dict:
    """The learner's sliding_window_mask as a band, as the causal mask (window >= T) and for the
    last queries of a chunk; what the last tokens reach through BAND_LAYERS stacked windowed layers,
    and how many positions the last token reaches after 1..REACH_LAYERS layers, all computed here
    from the learner's masks by boolean matrix products."""
    import torch

    T, W, Tq = BAND_T, BAND_WINDOW, BAND_QUERIES

    def mask(tq, tk, window):
        call = f"sliding_window_mask({tq}, {tk}, {window})"
        return _tensor(learner.sliding_window_mask(tq, tk, window), (tq, tk), dtype=torch.bool, call=call,
                       what="The mask").cpu()

    band, causal, chunk = mask(T, T, W), mask(T, T, T), mask(Tq, T, W)
    # Layer l's output at position i mixes layer l - 1's outputs at the keys i may see: i reaches
    # j through L layers iff the L-th boolean power of the mask holds (i, j).
    reach = band.clone()
    for _ in range(BAND_LAYERS - 1):
        reach = (reach.double() @ band.double()) > 0   # (T, T)
    long = mask(REACH_T, REACH_T, W).double()
    last = long[-1:]   # (1, T): what the last token sees
    sizes = []
    for _ in range(REACH_LAYERS):
        sizes.append(int((last > 0).sum()))
        last = last @ long   # one more layer below
    return {"T": T, "window": W, "queries": Tq, "layers": BAND_LAYERS,
            "panels": [{"title": f"sliding_window_mask({T}, {T}, {W})", "mask": band.numpy()},
                       {"title": f"sliding_window_mask({T}, {T}, {T}):\nthe window covers T: causal", "mask": causal.numpy()},
                       {"title": f"sliding_window_mask({Tq}, {T}, {W}):\n{Tq} new queries, bottom-right", "mask": chunk.numpy()},
                       {"title": f"reached through {BAND_LAYERS} layers of window {W}", "mask": reach.numpy()}],
            "reach_T": REACH_T, "reach_layers": list(range(1, REACH_LAYERS + 1)), "reach": sizes}


def draw_band(data: dict):
    from matplotlib.figure import Figure

    panels = data["panels"]
    figure = Figure(figsize=(17, 4.8), layout="constrained")
    axes = figure.subplots(1, len(panels) + 1, width_ratios=[1] * len(panels) + [1.4])
    for ax, panel in zip(axes, panels):
        mask = np.asarray(panel["mask"], dtype=float)
        ax.imshow(mask, cmap="Blues", vmin=0.0, vmax=1.2, aspect="equal", interpolation="nearest")
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("key position j")
        ax.set_yticks(range(mask.shape[0]), [str(data["T"] - mask.shape[0] + i) for i in range(mask.shape[0])],
                      fontsize=7)
    axes[0].set_ylabel("query position (bottom-right aligned)")
    curve = axes[-1]
    L = np.array(data["reach_layers"])
    W = data["window"]
    curve.plot(L, data["reach"], "o", color="tab:blue", label="from your masks: the last token's reach")
    curve.plot(L, L * (W - 1) + 1, "--", color="grey", label=f"L·(W - 1) + 1, W = {W}")
    curve.axhline(W, color="tab:red", linestyle=":", linewidth=1, label="one layer's window")
    curve.set(xlabel="layers L", ylabel="input positions reached",
              title=f"Receptive field of the last of {data['reach_T']} tokens")
    return _finish(figure, curve, f"sliding-window, from your sliding_window_mask (True = may attend, dark): a band "
                   f"of {W} keys per query, whose reach grows by W - 1 = {W - 1} with every layer")


# --- doc-masking: documents ---------------------------------------------------------------------

DOC_CU_SEQLENS = [0, 6, 10, 10, 18]   # documents of 6, 4, 0 and 8 tokens: an empty one too
DOC_PREFIX_LENS = [3, 2, 0, 4]        # prefixes of 3, 2 and 4 tokens (the empty document: 0)


def documents_data(learner: Learner, **_) -> dict:
    """The learner's document_mask and prefix_lm_mask of one packed row side by side, and the
    document_ids and position_ids they are built from."""
    import torch

    T = DOC_CU_SEQLENS[-1]
    cu_seqlens, prefix_lens = torch.tensor(DOC_CU_SEQLENS, dtype=torch.int32), torch.tensor(DOC_PREFIX_LENS)
    row = f"cu_seqlens = tensor({DOC_CU_SEQLENS}, dtype=torch.int32)"
    ids = _tensor(learner.document_ids(cu_seqlens), (T,), dtype=torch.int64, call=f"document_ids({row})").cpu()
    pos = _tensor(learner.position_ids(cu_seqlens), (T,), dtype=torch.int64, call=f"position_ids({row})").cpu()
    doc = _tensor(learner.document_mask(cu_seqlens), (T, T), dtype=torch.bool, call=f"document_mask({row})",
                  what="The mask").cpu()
    call = f"prefix_lm_mask({row}, tensor({DOC_PREFIX_LENS}))"
    prefix = _tensor(learner.prefix_lm_mask(cu_seqlens, prefix_lens), (T, T), dtype=torch.bool, call=call,
                     what="The mask").cpu()
    return {"cu_seqlens": DOC_CU_SEQLENS, "prefix_lens": DOC_PREFIX_LENS, "document_ids": ids.tolist(),
            "position_ids": pos.tolist(),
            "panels": [{"title": "document_mask(cu_seqlens):\neach document its own causal triangle",
                        "mask": doc.numpy()},
                       {"title": f"prefix_lm_mask(cu_seqlens, {DOC_PREFIX_LENS}):\nthe prefix seen whole (dark), "
                                 "causal after it", "mask": prefix.numpy()}]}


def draw_documents(data: dict):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    ids, pos, bounds = np.array(data["document_ids"]), np.array(data["position_ids"]), data["cu_seqlens"]
    T = len(ids)
    colours = colormaps["tab10"](ids % 10)[:, :3]   # (T, 3): each query's document, as your document_ids say
    figure = Figure(figsize=(15, 5.4), layout="constrained")
    axes = figure.subplots(1, 3, width_ratios=[1, 1, 1.3])
    for ax, panel in zip(axes, data["panels"]):
        mask = np.asarray(panel["mask"], dtype=bool)
        # Allowed keys in the query's colour, keys after the query (a prefix read whole) darker.
        later = np.triu(np.ones((T, T), dtype=bool), k=1)
        image = np.ones((T, T, 3))
        shade = np.where(later[..., None], 0.6 * colours[:, None, :], 0.35 + 0.65 * colours[:, None, :])
        image[mask] = np.broadcast_to(shade, (T, T, 3))[mask]
        ax.imshow(image, aspect="equal", interpolation="nearest")
        for b in sorted(set(bounds[1:-1])):   # where the documents really start, from cu_seqlens
            ax.axhline(b - 0.5, color="grey", linestyle="--", linewidth=0.8)
            ax.axvline(b - 0.5, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xticks(range(T), [str(t) for t in range(T)], fontsize=7)
        ax.set_yticks(range(T), [f"{t} (doc {d})" for t, d in enumerate(ids)], fontsize=7)
        ax.set_xlabel("key: token in the packed row")
    axes[0].set_ylabel("query (its document, from your document_ids)")
    curve = axes[2]
    curve.bar(range(T), pos, color=colours, label="your position_ids, coloured by document")
    curve.scatter(range(T), pos, c=colours, s=14, zorder=3)   # so that the zeros show
    curve.plot(range(T), range(T), "--", color="grey", label="the index in the row: positions not reset")
    for b in sorted(set(bounds[1:-1])):
        curve.axvline(b - 0.5, color="grey", linestyle=":", linewidth=0.8)
    curve.set_xticks(range(T), [str(t) for t in range(T)], fontsize=7)
    curve.set(xlabel="token in the packed row", ylabel="position_id",
              title=f"position_ids: 0 again at each document's first token\ncu_seqlens = {bounds}")
    return _finish(figure, curve, "doc-masking, from your code (dashed: where cu_seqlens starts a document): no "
                   "query sees another document; a prefix is seen whole by its own document only")


# --- rope: rotation -----------------------------------------------------------------------------

ROPE_T, ROPE_HD = 256, 64              # positions and head_dim drawn: pair wavelengths 2π to ~2π·7500
ROPE_STARTS, ROPE_OFFSETS = [0, 100, 1000], 64   # key positions n, and offsets m - n = 0..64 from each


def rotation_data(learner: Learner, *, seed: int, **_) -> dict:
    """cos(p·θ_i) from the learner's rope_cache(ROPE_T, ROPE_HD), and q·k of one fixed q and k
    rotated by the learner's apply_rope, the key at n and the query at m = n + r, for each start n."""
    import torch

    half = ROPE_HD // 2
    call = f"rope_cache({ROPE_T}, {ROPE_HD})"
    got = learner.rope_cache(ROPE_T, ROPE_HD)
    if type(got) is not tuple or len(got) != 2:
        _fail("The call must return a pair (cos, sin).", call=call, got=describe_value(got), expected="tuple (cos, sin)")
    cos = _tensor(got[0], (ROPE_T, half), call=call, what="cos").double().cpu()
    P = ROPE_STARTS[-1] + ROPE_OFFSETS + 1
    cache = learner.rope_cache(P, ROPE_HD)   # rows up to the last query's position
    q, k = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, 1, 1, 1, ROPE_HD))).float()
    r = torch.arange(ROPE_OFFSETS + 1)
    dots = []
    for n in ROPE_STARTS:
        rope_call = f"apply_rope(q, cos, sin, {n} + arange({ROPE_OFFSETS + 1}))"
        shape = (1, 1, ROPE_OFFSETS + 1, ROPE_HD)
        q_rot = _tensor(learner.apply_rope(q.expand(shape), *cache, n + r), shape, call=rope_call).double().cpu()
        k_rot = _tensor(learner.apply_rope(k.expand(shape), *cache, torch.full_like(r, n)), shape,
                        call=rope_call.replace("q,", "k,")).double().cpu()
        dots.append((q_rot * k_rot).sum(-1).flatten().numpy())   # (R,): q at n + r against k at n
    return {"T": ROPE_T, "hd": ROPE_HD, "cos": cos.numpy(), "starts": ROPE_STARTS,
            "offsets": list(range(ROPE_OFFSETS + 1)), "dots": np.stack(dots)}


def draw_rotation(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    heatmap, curve = figure.subplots(1, 2)
    image = heatmap.imshow(data["cos"], aspect="auto", cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
    heatmap.set(xlabel=f"pair i (dimensions 2i, 2i+1): wavelength 2π·10000^(2i/{data['hd']})", ylabel="position p",
                title=f"cos(p·θ_i) from rope_cache({data['T']}, {data['hd']})")
    figure.colorbar(image, ax=heatmap, label="cos(p·θ_i)", shrink=0.9)
    r = np.array(data["offsets"])
    for n, dots, style in zip(data["starts"], data["dots"], ["-", "--", ":"]):
        curve.plot(r, dots, linestyle=style, linewidth=2, label=f"key at n = {n}, query at n + (m − n)")
    curve.set(xlabel="offset m − n", ylabel="(R_m q) · (R_n k)", title="q·k after apply_rope: one curve if only m − n matters")
    return _finish(figure, curve, "rope, from your rope_cache and apply_rope: slow pairs to the right, "
                   "and a score that only the distance decides")


# --- roofline: roofline -------------------------------------------------------------------------

# An H100 SXM in bf16, and a Llama-3-8B-like model: 32 layers, 32 query heads, 8 K/V heads of 128.
ROOF_FLOPS, ROOF_BYTES = 989e12, 3.35e12
ROOF_PARAMS, ROOF_HEADS, ROOF_KV_HEADS = 8_000_000_000, 32, 8
ROOF_KV_PER_TOKEN = 2 * 32 * ROOF_KV_HEADS * 128 * 2
ROOF_DECODE_B, ROOF_PREFILL_B, ROOF_T = [1, 8, 64, 512], [1, 8], 4096
ROOF_STEP_B = [2**i for i in range(12)]   # 1 ... 2048
ROOF_STEP_T = [0, 1024, 8192]             # cached tokens per sequence


def _positive(value, *, call: str, what: str) -> float:
    """``value``, what ``call`` returned, which must be a positive finite number: a log axis draws it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        _fail(f"{what} is not a number.", call=call, got=describe_value(value), expected="a float")
    if not (math.isfinite(value) and value > 0):
        _fail(f"{what} is not a positive finite number.", call=call, got=repr(value), expected="a positive float")
    return float(value)


def _pair_of(member, *args, what: str) -> tuple:
    """(``member(*args)``, which must be a pair, the text of the call)."""
    call = call_text(member._label, args, {})
    value = member(*args)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        _fail(f"The call must return a pair {what}.", call=call, got=describe_value(value), expected=f"tuple {what}")
    return value, call


def roofline_data(learner: Learner, **_) -> dict:
    """FLOPs per byte of prefill and decode from the learner's prefill_intensity and decode_intensity
    (weight matmuls and attention apart) for a few batch sizes, the learner's crossover_batch, and
    tokens per second of the learner's decode_step as the batch grows, at a few cache lengths."""
    points = []
    for phase, member, batches in (("decode", learner.decode_intensity, ROOF_DECODE_B),
                                   ("prefill", learner.prefill_intensity, ROOF_PREFILL_B)):
        for B in batches:
            pair, call = _pair_of(member, B, ROOF_T, ROOF_HEADS, ROOF_KV_HEADS, what="(weight matmuls, attention)")
            for part, value in zip(("weights", "attention"), pair):
                points.append({"phase": phase, "part": part, "B": B,
                               "intensity": _positive(value, call=call, what=f"The {part} part")})
    crossover = _positive(learner.crossover_batch(ROOF_FLOPS, ROOF_BYTES),
                          call=f"crossover_batch({ROOF_FLOPS:g}, {ROOF_BYTES:g})", what="The crossover batch")
    steps = []
    for T in ROOF_STEP_T:
        steps.append({"T": T, "series": []})
        for B in ROOF_STEP_B:
            (seconds, bound), call = _pair_of(learner.decode_step, ROOF_PARAMS, ROOF_KV_PER_TOKEN, T, B, ROOF_BYTES,
                                              ROOF_FLOPS, 2, what="(seconds, bound)")
            if bound not in ("memory", "compute"):
                _fail("The bound must be \"memory\" or \"compute\".", call=call, got=describe_value(bound),
                      expected="\"memory\" | \"compute\"")
            steps[-1]["series"].append({"tokens_per_s": B / _positive(seconds, call=call, what="The time"), "bound": bound})
    return {"flops_per_s": ROOF_FLOPS, "bytes_per_s": ROOF_BYTES, "T": ROOF_T, "n_heads": ROOF_HEADS,
            "n_kv_heads": ROOF_KV_HEADS, "points": points, "crossover": crossover, "params": ROOF_PARAMS,
            "step_B": ROOF_STEP_B, "steps": steps}


def draw_roofline(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    roof, steps = figure.subplots(1, 2)
    peak, bandwidth = data["flops_per_s"], data["bytes_per_s"]
    ridge = peak / bandwidth
    intensities = [p["intensity"] for p in data["points"]]
    x = np.geomspace(min(0.25, min(intensities) / 2), max(4 * ridge, max(intensities) * 2), 200)
    roof.plot(x, np.minimum(peak, x * bandwidth) / 1e12, color="black", linewidth=2,
              label=f"attainable: min(peak, intensity × {bandwidth / 1e12:g} TB/s)")
    roof.axvline(ridge, color="grey", linestyle=":", linewidth=1, label=f"ridge: {ridge:.0f} FLOPs per byte")
    styles = {("decode", "weights"): ("o", "tab:blue"), ("decode", "attention"): ("s", "tab:orange"),
              ("prefill", "weights"): ("^", "tab:green"), ("prefill", "attention"): ("D", "tab:red")}
    for (phase, part), (marker, colour) in styles.items():
        mine = [p for p in data["points"] if p["phase"] == phase and p["part"] == part]
        I = np.array([p["intensity"] for p in mine])
        roof.plot(I, np.minimum(peak, I * bandwidth) / 1e12, marker, color=colour, markersize=8, linestyle="none",
                  label=f"{phase}, {part}: B = {', '.join(str(p['B']) for p in mine)}")
        labels = {}   # one label per point drawn: attention's intensity is the same at every B
        for p, i in zip(mine, I):
            labels.setdefault(float(i), []).append(str(p["B"]))
        for i, batches in labels.items():
            roof.annotate(f"B = {', '.join(batches)}", (i, min(peak, i * bandwidth) / 1e12), textcoords="offset points",
                          xytext=(6, -12) if part == "weights" else (-6, 8), ha="left" if part == "weights" else "right",
                          fontsize=7, color=colour)
    roof.set(xscale="log", yscale="log", ylim=(x[0] * bandwidth / 1e12, 3 * peak / 1e12),   # room above the roof
             xlabel="arithmetic intensity (FLOPs per byte of HBM)",
             ylabel="attainable TFLOP/s", title=f"Roofline: {data['n_heads']} query heads, {data['n_kv_heads']} "
             f"K/V heads, T = {data['T']:,}, bf16")
    B = np.array(data["step_B"], dtype=float)
    for cache, colour in zip(data["steps"], ("tab:blue", "tab:purple", "tab:brown")):
        rate = np.array([s["tokens_per_s"] for s in cache["series"]])
        steps.plot(B, rate, "-", color=colour, label=f"{cache['T']:,} tokens cached per sequence")
        compute = np.array([s["bound"] == "compute" for s in cache["series"]])
        steps.plot(B[~compute], rate[~compute], "o", color=colour, markersize=5)
        steps.plot(B[compute], rate[compute], "*", color=colour, markersize=10)
    steps.plot([], [], "o", color="grey", label="memory-bound")
    steps.plot([], [], "*", color="grey", markersize=10, label="compute-bound")
    steps.axvline(data["crossover"], color="grey", linestyle=":", linewidth=1,
                  label=f"your crossover_batch: {data['crossover']:.0f}")
    steps.set(xscale="log", yscale="log", xlabel="batch size B (sequences)", ylabel="tokens per second (upper bound)",
              title=f"decode_step: {data['params'] / 1e9:g}B parameters in bf16 on an H100")
    steps.minorticks_off()
    steps.set_xticks(B, [str(int(b)) for b in B])
    for ax in (roof, steps):
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("roofline, from your code: decode's weight matmuls climb with the batch, its attention stays "
                    "put; prefill sits under the flat roof")
    return figure


# --- rope-scaling: frequencies ------------------------------------------------------------------

# Llama 3.1's RoPE (head_dim 128, base 500,000) stretched 8 times from 8,192 tokens by each method.
RS_HD, RS_BASE, RS_FACTOR, RS_ORIGINAL = 128, 500000.0, 8.0, 8192
RS_METHODS = [("rope_inv_freq", "RoPE (unscaled)", ()), ("linear_inv_freq", "Position Interpolation", (RS_FACTOR,)),
              ("ntk_inv_freq", "NTK-aware", (RS_FACTOR,)), ("yarn_inv_freq", "YaRN", (RS_FACTOR, RS_ORIGINAL)),
              ("llama3_inv_freq", "Llama 3.1", (RS_FACTOR, RS_ORIGINAL))]


def frequencies_data(learner: Learner, **_) -> dict:
    """The frequency of each pair under each method, from the learner's *_inv_freq functions."""
    import torch

    curves = []
    for name, label, extra in RS_METHODS:
        args = (RS_HD, RS_BASE, *extra)
        call = call_text(name, args, {})
        freq = _tensor(getattr(learner, name)(*args), (RS_HD // 2,), dtype=torch.float64, call=call,
                       what="The frequencies").cpu()
        if not bool((freq > 0).all()):
            _fail("The frequencies must be positive: a log axis draws them.", call=call, got=describe_value(freq),
                  expected="positive frequencies")
        curves.append({"label": label, "call": call, "freq": freq.numpy()})
    return {"hd": RS_HD, "base": RS_BASE, "factor": RS_FACTOR, "original": RS_ORIGINAL, "curves": curves}


def draw_frequencies(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 5), layout="constrained")
    freqs, ratios = figure.subplots(1, 2)
    pairs = np.arange(data["hd"] // 2)
    theta = np.asarray(data["curves"][0]["freq"])
    # The wavelengths 2π/θ_i that bound Llama 3.1's bands: original / 4 and original / 1.
    bounds = [np.log(data["original"] / f / (2 * np.pi)) / np.log(data["base"]) * data["hd"] / 2 for f in (4, 1)]
    for curve, style in zip(data["curves"], ["-", "--", "-.", "-", ":"]):
        freq = np.asarray(curve["freq"])
        freqs.semilogy(pairs, freq, linestyle=style, linewidth=2, label=curve["label"])
        ratios.plot(pairs, freq / theta, linestyle=style, linewidth=2, label=curve["label"])
    for ax in (freqs, ratios):
        for b in bounds:
            ax.axvline(b, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("pair i (fast on the left, slow on the right)")
    freqs.set(ylabel="frequency θ_i (radians per position)",
              title=f"frequencies, head_dim {data['hd']}, base {data['base']:,.0f}, factor {data['factor']:g}")
    ratios.set(ylabel="frequency / RoPE's θ_i", ylim=(0, 1.08),
               title=f"1 = pair untouched, 1/{data['factor']:g} = interpolated (dotted: wavelengths "
                     f"{data['original'] // 4:,} and {data['original']:,})")
    ratios.axhline(1 / data["factor"], color="grey", linewidth=0.6)
    freqs.grid(True, which="major", alpha=0.3)
    freqs.legend(fontsize=8)
    return _finish(figure, ratios, f"rope-scaling, from your code: stretching {data['original']:,} tokens "
                   f"{data['factor']:g} times; PI slows every pair, the others keep the fast ones")


# --- linear-attention: weights ------------------------------------------------------------------

LA_T, LA_D = 16, 8   # the heatmaps: one head, 16 tokens, keys of 8
LA_STREAM, LA_DV = 64, 8   # the memory curve: tokens decoded, the values' width


def linear_weights_data(learner: Learner, *, seed: int, **_) -> dict:
    """The weights the learner's causal linear_attention gives each key, read out with one-hot
    values (v = the identity: out row t is the weights of query t), beside softmax's for the same q
    and k; and the bytes of the state the learner's linear_attention_step returns after each token,
    beside a KV cache's."""
    import torch

    rng = np.random.default_rng(seed)
    q, k = (torch.tensor(rng.standard_normal((1, 1, LA_T, LA_D))) for _ in range(2))
    call = f"linear_attention(q, k, torch.eye({LA_T}), causal=True)"
    weights = _tensor(learner.linear_attention(q, k, torch.eye(LA_T, dtype=torch.float64)[None, None], causal=True),
                      (1, 1, LA_T, LA_T), dtype=torch.float64, call=call, what="The output").cpu()[0, 0]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(LA_D))[0, 0]
    softmax = torch.softmax(scores.masked_fill(torch.ones(LA_T, LA_T, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
    qs, ks, vs = (torch.tensor(rng.standard_normal((1, 1, LA_STREAM, w))) for w in (LA_D, LA_D, LA_DV))
    state, held = None, []
    for t in range(LA_STREAM):
        call = f"linear_attention_step(q[:, :, {t}], k[:, :, {t}], v[:, :, {t}], state)"
        got = learner.linear_attention_step(qs[..., t, :], ks[..., t, :], vs[..., t, :], state)
        if type(got) not in (tuple, list) or len(got) != 2 or type(got[1]) not in (tuple, list):
            _fail("linear_attention_step must return a pair (out, state).", call=call, got=describe_value(got),
                  expected="tuple (out, (S, z))")
        state = got[1]
        held.append(sum(x.numel() * x.element_size() for x in state if type(x) is torch.Tensor))
    return {"T": LA_T, "d": LA_D, "dv": LA_DV, "linear": weights.numpy(), "softmax": softmax.numpy(),
            "tokens": list(range(1, LA_STREAM + 1)), "state_bytes": held,
            "cache_bytes": [t * (LA_D + LA_DV) * 8 for t in range(1, LA_STREAM + 1)]}


def draw_linear_weights(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.8), layout="constrained")
    linear, softmax, curve = figure.subplots(1, 3, width_ratios=[1, 1, 1.3])
    top = max(np.max(data["linear"]), np.max(data["softmax"]))
    for ax, key, title in ((linear, "linear", "your causal linear_attention:\nphi(q)·phi(k) / Σ, phi = elu + 1"),
                           (softmax, "softmax", "softmax attention, same q and k:\nexp(q·k / √d) / Σ")):
        ax.imshow(np.asarray(data[key]), cmap="Blues", vmin=0.0, vmax=top, aspect="equal", interpolation="nearest")
        ax.set(title=title, xlabel="key position j", ylabel="query position t")
    curve.plot(data["tokens"], data["state_bytes"], "o-", markersize=3, color="tab:blue",
               label="your state (S, z) after t tokens")
    curve.plot(data["tokens"], data["cache_bytes"], "--", color="tab:red", label="a KV cache of t tokens")
    curve.set(xlabel="tokens decoded t", ylabel="bytes per head (float64)",
              title=f"decoding memory, d = {data['d']}, dv = {data['dv']}")
    return _finish(figure, curve, "linear-attention, from your code: flatter weights than softmax's (a kernel "
                   "cannot peak like exp), and a state that stays one size while a KV cache grows")


# --- prefix-cache: blocks -----------------------------------------------------------------------

PC_BLOCKS, PC_BLOCK_SIZE = 12, 4   # a small pool: the stream below evicts
# (request, prompt as slices of named streams) in arrival order, "free x" between them.
PC_STREAMS = {"sys": 10, "doc": 12, "u0": 6, "u1": 3, "u2": 5, "u3": 7, "u4": 2, "u5": 4}
PC_SCRIPT = (("r0", (("sys", 10), ("u0", 6))), ("r1", (("sys", 10), ("u1", 3))), "free r0",
             ("r2", (("sys", 10), ("u0", 6), ("u2", 5))), "free r1", ("r3", (("doc", 12), ("u3", 7))), "free r2",
             ("r4", (("sys", 10), ("u4", 2))), "free r3", ("r5", (("doc", 12), ("u5", 4))),
             ("r6", (("sys", 10), ("u0", 6), ("u2", 5))))


def prefix_blocks_data(learner: Learner, **_) -> dict:
    """The blocks the learner's PrefixCache gives each request of a scripted stream, in arrival
    order, and how many of its tokens were cached: which block each request's tokens sit in."""
    tokens, first = {}, 1000
    for name, n in PC_STREAMS.items():   # distinct token ids per stream
        tokens[name], first = list(range(first, first + n)), first + 100
    cache = learner.PrefixCache(PC_BLOCKS, PC_BLOCK_SIZE)
    requests = []
    for item in PC_SCRIPT:
        if type(item) is str:
            rid = item.split()[1]
            cache.free(rid)
            requests.append({"free": rid})
            continue
        rid, parts = item
        prompt = [t for name, n in parts for t in tokens[name][:n]]
        call = f"cache.allocate({rid!r}, {' + '.join(name for name, _ in parts)}: {len(prompt)} tokens)"
        got = cache.allocate(rid, prompt)
        if not (type(got) in (tuple, list) and len(got) == 2 and type(got[0]) in (list, tuple)
                and all(type(b) is int for b in got[0]) and type(got[1]) is int):
            _fail("allocate must return (block_ids, num_cached_tokens).", call=call, got=describe_value(got),
                  expected="a tuple (list of ints, int)")
        blocks, cached, need = list(got[0]), got[1], -(-len(prompt) // PC_BLOCK_SIZE)   # ceil
        if len(blocks) != need or not 0 <= cached < len(prompt) or any(not 0 <= b < PC_BLOCKS for b in blocks):
            _fail("A request holds ceil(len(tokens) / block_size) blocks of the pool, and fewer cached tokens than "
                  "its prompt.", call=call, got=f"{len(blocks)} blocks {blocks}, {cached} tokens cached",
                  expected=f"{need} ids in range({PC_BLOCKS}), under {len(prompt)} cached")
        requests.append({"id": rid, "parts": [f"{name}[:{n}]" for name, n in parts], "tokens": len(prompt),
                         "blocks": blocks, "cached": cached})
    return {"num_blocks": PC_BLOCKS, "block_size": PC_BLOCK_SIZE, "requests": requests}


def draw_prefix_blocks(data: dict):
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    bs, n_blocks = data["block_size"], data["num_blocks"]
    rows = [r for r in data["requests"] if "id" in r]
    width = max(-(-r["tokens"] // bs) for r in rows)
    colours = colormaps["tab20"](np.arange(n_blocks) % 20)
    figure = Figure(figsize=(15, 5.4), layout="constrained")
    grid, bars = figure.subplots(1, 2, width_ratios=[2.2, 1])
    order, y = [], 0
    for item in data["requests"]:
        if "free" in item:   # a dashed line where a request ends
            grid.axhline(y - 0.5, color="grey", linestyle=":", linewidth=0.8)
            grid.text(width + 0.1, y - 0.5, f"free {item['free']}", va="center", fontsize=7, color="grey")
            continue
        hits = item["cached"] // bs
        for i, b in enumerate(item["blocks"]):
            filled = min(bs, item["tokens"] - i * bs)
            grid.add_patch(Rectangle((i - 0.5, y - 0.4), filled / bs, 0.8, facecolor=colours[b],
                                     edgecolor="black", linewidth=2.2 if i < hits else 0.6,
                                     hatch="//" if i < hits else None))
            grid.text(i - 0.5 + filled / bs / 2, y, f"{b}", ha="center", va="center", fontsize=8)
        order.append(f"{item['id']}: {' + '.join(item['parts'])}")
        y += 1
    grid.set(xlim=(-0.6, width + 1.2), ylim=(y - 0.5, -0.7), xlabel=f"block of the prompt ({bs} tokens each)",
             title=f"the block each request's tokens sit in, by your block ids (a pool of {n_blocks})\nhatched, "
                   "thick: a cache hit, a block an earlier request filled")
    grid.set_yticks(range(len(order)), order, fontsize=8)
    grid.set_xticks(range(width))
    ids = [r["id"] for r in rows]
    cached = [r["cached"] for r in rows]
    computed = [r["tokens"] - r["cached"] for r in rows]
    bars.barh(ids, cached, color="tab:green", label="cached tokens (num_cached_tokens)")
    bars.barh(ids, computed, left=cached, color="tab:orange", label="tokens computed")
    bars.invert_yaxis()
    bars.set(xlabel="prompt tokens", title="what each request computes")
    return _finish(figure, bars, "prefix-cache, from your code: requests share the full blocks of a common prefix, "
                   "a freed block keeps its hash until the least recently used are taken")
# --- spec-decode: tree --------------------------------------------------------------------------

SD_PARENTS = [-1, -1, 0, 0, 1, 2, 2, 4]   # two candidates for the next token, their children, theirs
SD_PREFIX = 3


def tree_data(learner: Learner, **_) -> dict:
    """The learner's tree_mask and tree_positions of a draft tree after a prefix, and its tree_mask
    of a chain of as many nodes: the tree's mask has holes where the chain's is a triangle."""
    import torch

    n, p = len(SD_PARENTS), SD_PREFIX
    chain = [-1] + list(range(n - 1))

    def mask(parents):
        call = f"tree_mask({parents}, {p})"
        return _tensor(learner.tree_mask(parents, p), (n, p + n), dtype=torch.bool, call=call, what="The mask").cpu()

    call = f"tree_positions({SD_PARENTS}, {p})"
    positions = _tensor(learner.tree_positions(SD_PARENTS, p), (n,), dtype=torch.int64, call=call,
                        what="The positions").cpu()
    return {"parents": SD_PARENTS, "prefix": p, "positions": positions.tolist(),
            "tree": mask(SD_PARENTS).numpy(), "chain": mask(chain).numpy()}


def draw_tree(data: dict):
    from matplotlib.figure import Figure

    parents, p, positions = data["parents"], data["prefix"], data["positions"]
    figure = Figure(figsize=(16, 5.2), layout="constrained")
    graph, tree, chain = figure.subplots(1, 3, width_ratios=[1.2, 1, 1])
    # The tree: x is the position the learner gave each node, y spreads each position's nodes.
    row_of, seen = {}, {}
    for i, x in enumerate(positions):
        row_of[i] = seen.get(x, 0)
        seen[x] = row_of[i] + 1
    for j in range(p):
        graph.plot(j, 0, "s", color="grey", markersize=16)
        graph.annotate(f"p{j}", (j, 0), ha="center", va="center", color="white", fontsize=8)
    for node, parent in enumerate(parents):   # an edge from each node's parent (the prefix's last token for -1)
        x0, y0 = (p - 1, 0) if parent < 0 else (positions[parent], -row_of[parent])
        graph.plot([x0, positions[node]], [y0, -row_of[node]], "-", color="tab:blue", linewidth=1, zorder=1)
    for i, x in enumerate(positions):
        graph.plot(x, -row_of[i], "o", color="tab:blue", markersize=18, zorder=2)
        graph.annotate(str(i), (x, -row_of[i]), ha="center", va="center", color="white", fontsize=9)
    graph.set(xlabel="position (your tree_positions)", title=f"the draft tree after a prefix of {p} tokens",
              yticks=[])
    graph.set_xticks(range(max(positions) + 1))
    graph.margins(0.15)
    n = len(parents)
    labels = [f"p{j}" for j in range(p)] + [str(i) for i in range(n)]
    for ax, key, title in ((tree, "tree", f"tree_mask({parents}, {p})"),
                           (chain, "chain", f"tree_mask of a chain of {n}, {p}: causal")):
        ax.imshow(np.asarray(data[key], dtype=float), cmap="Blues", vmin=0.0, vmax=1.2, aspect="equal",
                  interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(p + n), labels, fontsize=8)
        ax.set_yticks(range(n), [str(i) for i in range(n)], fontsize=8)
        ax.set(xlabel="key: the prefix, then the nodes", ylabel="node")
    figure.suptitle("spec-decode, from your code: each node sees the prefix, its ancestors and itself (dark), "
                    "at position prefix + depth; a chain's mask is the causal one")
    return figure


# --- ring-attention: ring ---------------------------------------------------------------------

RING_WORLD, RING_T, RING_D = 4, 8, 6   # 4 ranks of 8 tokens; head_dim 6 is neither 8 nor 4


def ring_data(learner: Learner, *, seed: int, **_) -> dict:
    """Which positions the learner's zigzag_shard gives each rank, and how many scores each rank's
    causal ring_attention computes (its recorded products that contract head_dim), in the
    contiguous and the zig-zag layout, 4 ranks of the learner's file."""
    import torch

    from ..engine.products import score_tiles

    W, T = RING_WORLD, RING_T
    positions = torch.arange(W * T)
    zigzag = []
    for rank in range(W):
        call = f"zigzag_shard(torch.arange({W * T}), {rank}, {W}, 0)"
        zigzag.append(_tensor(learner.zigzag_shard(positions, rank, W, 0), (T,), dtype=torch.int64, call=call).tolist())
    rng = np.random.default_rng(seed)
    q, k, v = (torch.tensor(rng.standard_normal((1, 1, W * T, RING_D))) for _ in range(3))
    ranks, scores = learner.ranks(W), {}
    for layout, held in (("contiguous", [list(range(r * T, (r + 1) * T)) for r in range(W)]), ("zig-zag", zigzag)):
        def run(rank, L, held=held, layout=layout):
            idx = torch.tensor(held[rank])
            with L.recording() as ops:
                _pair(L.ring_attention(q[:, :, idx], k[:, :, idx], v[:, :, idx], True, rank, W, layout == "zig-zag"),
                      call=f"ring_attention(q, k, v, True, {rank}, {W}, zigzag={layout == 'zig-zag'})")
            return sum(int(np.prod(tile)) for tile in score_tiles(ops, RING_D))
        scores[layout] = ranks.each(run)
    return {"world": W, "T_local": T, "zigzag": zigzag, "scores": scores}


def draw_ring(data: dict):
    from matplotlib.figure import Figure

    W, T = data["world"], data["T_local"]
    figure = Figure(figsize=(15, 4.8), layout="constrained")
    steps, owners, bars = figure.subplots(1, 3, width_ratios=[1, 1.3, 1.2])
    held = np.array([[(rank - step) % W for rank in range(W)] for step in range(W)])
    steps.imshow(held, cmap="tab10", vmin=0, vmax=9, aspect="equal")
    for step in range(W):
        for rank in range(W):
            steps.text(rank, step, f"k,v of\nrank {held[step, rank]}", ha="center", va="center", fontsize=8)
    steps.set(title="the ring: the chunk each rank holds\n(sent on to rank + 1 after each step)",
              xlabel="rank", ylabel="step", xticks=range(W), yticks=range(W))
    n, gap = W * T, T // 2   # the two layouts side by side, a gap between
    owner = np.full(n, -1)
    for rank, positions in enumerate(data["zigzag"]):
        owner[positions] = rank
    grid = np.full((n, 2 * n + gap), np.nan)
    for i in range(n):
        grid[i, :i + 1] = i // T                         # contiguous: query i's rank computes its row
        grid[i, n + gap:n + gap + i + 1] = owner[i]   # zig-zag: the rank your zigzag_shard gives it
    owners.imshow(grid, cmap="tab10", vmin=0, vmax=9, aspect="equal", interpolation="nearest")
    owners.set(title="causal scores, coloured by the rank that computes them:\ncontiguous (left), "
                     "your zig-zag layout (right)", xlabel="key position", ylabel="query position",
               xticks=[0, n - 1, n + gap, 2 * n + gap - 1],
               xticklabels=["0", str(n - 1), "0", str(n - 1)])
    x = np.arange(W)
    for offset, layout in ((-0.2, "contiguous"), (0.2, "zig-zag")):
        bars.bar(x + offset, np.array(data["scores"][layout]) / T**2, width=0.4, label=f"{layout}, your ring")
    bars.axhline(1 + (W - 1) / 2, color="black", linestyle="--", linewidth=1, label="zig-zag's even share")
    bars.set(xticks=x, xlabel="rank", ylabel=f"blocks of {T}×{T} scores computed",
             title=f"causal work per rank, your ring_attention, {W} ranks")
    return _finish(figure, bars, "ring-attention, from your code: chunks of keys and values pass round the ring; "
                   "contiguous chunks leave the last rank all the causal work, zig-zag shares it out")


# (kata slug, plot kind) -> (data function, draw function); manifests say which a kata has.
PLOTS = {
    ("rope-scaling", "frequencies"): (frequencies_data, draw_frequencies),
    ("rope", "rotation"): (rotation_data, draw_rotation),
    ("sliding-window", "band"): (band_data, draw_band),
    ("flash-tiling", "memory"): (flash_memory_data, draw_flash_memory),
    ("scaling-variance", "curves"): (curves_data, draw_curves),
    ("causal-mask", "heatmaps"): (causal_heatmaps_data, draw_heatmaps),
    ("mha", "heatmaps"): (mha_heatmaps_data, draw_heatmaps),
    ("mha", "complexity"): (complexity_data, draw_complexity),
    ("cross-attention", "heatmaps"): (cross_heatmaps_data, draw_heatmaps),
    ("positional-encoding", "encodings"): (encodings_data, draw_encodings),
    ("roofline", "roofline"): (roofline_data, draw_roofline),
    ("doc-masking", "documents"): (documents_data, draw_documents),
    ("linear-attention", "weights"): (linear_weights_data, draw_linear_weights),
    ("prefix-cache", "blocks"): (prefix_blocks_data, draw_prefix_blocks),
    ("spec-decode", "tree"): (tree_data, draw_tree),
    ("ring-attention", "ring"): (ring_data, draw_ring),
}
