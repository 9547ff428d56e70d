"""Hidden checks of the kv-cache kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.engine.recording import recorded
from graders.kv_cache import (build, case_text, judge_decoding, judge_itself, normal, own_forward, schedule_text,
                              sdpa_causal, trusted, weights)


def fresh_config(case_rng, Hkv=None):
    """(B, d_model, n_heads, n_kv_heads) drawn from case_rng, head_dim != n_heads as in the public configs;
    n_kv_heads a divisor of n_heads (1 is multi-query attention, n_heads multi-head attention)."""
    H = int(case_rng.integers(2, 7))
    hd = int(case_rng.choice([n for n in range(3, 8) if n != H]))
    if Hkv is None:
        Hkv = int(case_rng.choice([n for n in range(1, H + 1) if H % n == 0]))
    return int(case_rng.integers(2, 4)), H * hd, H, Hkv


def fresh_chunks(case_rng, T):
    """A schedule of chunks of 1 to 4 tokens that add up to T: the first one 2 tokens or more, and
    a later one too (a chunk after cached tokens, where the mask's alignment shows even in a module
    that handles a single decoded token apart)."""
    while True:
        chunks = [int(case_rng.integers(2, 5))]
        while sum(chunks) < T:
            chunks.append(min(int(case_rng.integers(1, 5)), T - sum(chunks)))
        if max(chunks[1:]) >= 2:
            return tuple(chunks)


def test_decodes_any_chunk_schedule(learner, bugs, kata, case_rng, rng, device):
    """other configurations (multi-query attention included) and chunk schedules: decoding always gives the module's own full forward (or, where that is wrong, the right one)"""
    for Hkv in (1, None):
        B, d, H, n_kv = fresh_config(case_rng, Hkv)
        # Longer than every public sequence (10 tokens at most): a cache sized for those overflows.
        chunks = fresh_chunks(case_rng, int(case_rng.integers(11, 17)))
        sd, x = weights(rng, d, H, n_kv), normal(rng, B, sum(chunks), d)
        case = case_text(x, H, n_kv, f"decoded with one KVCache, {schedule_text(chunks)}")
        judge_decoding(learner, bugs, kata, device, build(learner, device, sd, H, n_kv), learner.KVCache(), sd, H,
                       n_kv, (x,), (chunks,), what=f"chunks of {', '.join(map(str, chunks))} tokens", case=case,
                       itself=own_forward)


@recorded
def trusted_stack(module, cache_cls, sds, H, Hkv, x, chunks):
    """Two trusted layers (the reference's or a bug's), each with its own cache, decoding x chunk
    by chunk through both, in float64 on the CPU: the second layer's outputs over time."""
    with torch.no_grad():
        layers, caches = [], [cache_cls(), cache_cls()]
        for sd in sds:
            layers.append(module(x.shape[-1], H, Hkv).double())
            layers[-1].load_state_dict({k: v.double() for k, v in sd.items()})
        outs, start = [], 0
        for t in chunks:
            h = x[:, start:start + t].double()
            for m, cache in zip(layers, caches):
                h = m(h, cache=cache, start_pos=start)
            outs.append(h)
            start += t
    return torch.cat(outs, dim=1).to(x.dtype)


def test_two_layers_keep_separate_caches(learner, bugs, kata, case_rng, rng, device):
    """two layers, each with its own module and KVCache, decode a sequence through both: the caches do not share state"""
    B, d, H, Hkv = fresh_config(case_rng)
    chunks = fresh_chunks(case_rng, int(case_rng.integers(6, 10)))
    sds = (weights(rng, d, H, Hkv), weights(rng, d, H, Hkv))
    x = normal(rng, B, sum(chunks), d)
    case = case_text(x, H, Hkv, f"two layers with weights of their own, each with its own KVCache; x decoded in "
                                f"{schedule_text(chunks)}, each chunk through layer 1, then its output through layer 2")
    layers = [build(learner, device, sd, H, Hkv) for sd in sds]
    caches = [learner.KVCache(), learner.KVCache()]
    outs, start = [], 0
    for t in chunks:
        h = x[:, start:start + t]
        for i, (m, cache) in enumerate(zip(layers, caches), 1):
            h = m(h, cache=cache, start_pos=start)
            expect.form(h, torch.Tensor, (B, t, d), dtype=x.dtype, device=device, case=case, what="the output",
                        call=f"layer{i}(h, cache=cache{i}, start_pos={start})")
        outs.append(h.cpu())
        start += t
    got = torch.cat(outs, dim=1)
    call = "layer2(layer1(x[:, s:s + t], cache=cache1, start_pos=s), cache=cache2, start_pos=s) for each chunk"
    what = "the second layer's outputs, concatenated over time"
    compute = lambda impl: trusted_stack(impl.GroupedQueryAttention, impl.KVCache, sds, H, Hkv, x, chunks)
    diagnose = lambda: bugs.match(got, compute, **kata.tolerance("float32"))
    # Each layer's full forward without a cache, one after the other: what decoding must give.
    first = trusted(bugs.reference.GroupedQueryAttention, bugs.reference.KVCache, sds[0], H, Hkv, (x,), (None,))[0]
    reference = trusted(bugs.reference.GroupedQueryAttention, bugs.reference.KVCache, sds[1], H, Hkv, (first,),
                        (None,))[0]
    # Self-consistency: the same two modules' full forwards, one after the other, without caches.
    hidden = own_forward(layers[0], x)
    own = None if hidden is None else own_forward(layers[1], hidden)
    judge_itself(kata, got, own, "layer2(layer1(x)), the same two modules' full forwards without caches",
                 ((sdpa_causal(sds[1], H, Hkv, sdpa_causal(sds[0], H, Hkv, x)),
                   "two F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) layers on the whole sequence "
                   "at once"), (reference, "the reference's two layers")),
                 call=call, case=case, what=what, diagnose=diagnose)
