"""Hidden checks of the tp-attention kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.tp_attention import (CALL, CASE, REPLICATED, build, compare, forward_all, full_weights, normal,
                                   returned, simulate)


def test_gqa_kv_replicated(learner, bugs, kata, rng):
    """fewer KV heads than ranks (2 KV heads over 4 ranks, one KV head over 2 and 4) equal the single-process module"""
    for world in (4, 2):
        ranks = learner.ranks(world)
        for cfg in (cfg for w, cfg in REPLICATED if w == world):
            compare(ranks, bugs, kata, rng, world, cfg)


def test_bias_added_once(learner, bugs, kata, rng):
    """c_proj's bias counts once: with W_o = 0 the output is the bias"""
    B, T, d, H, Hkv = 2, 5, 24, 4, 2
    for world in (2, 4):
        sd = full_weights(rng, d, H, Hkv)
        sd["c_proj.weight"] = torch.zeros(d, d, dtype=torch.float64)   # every share is 0: only the bias remains
        x = normal(rng, B, T, d)
        call = CALL.format(H=H, Hkv=Hkv, world=world)
        case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, Hkv=Hkv, world=world) + "; then c_proj.weight = 0"
        ranks = learner.ranks(world)
        outs, _ = forward_all(ranks, build(ranks, sd, H, Hkv, world), x, call=call, case=case)
        diagnose = lambda: bugs.match(tuple(outs), lambda impl: simulate(impl.TensorParallelAttention, sd, H, Hkv,
                                                                          world, x)[0], **kata.tolerance("float32"))
        returned(outs, call, case, diagnose)
        for rank, got in enumerate(outs):
            expect.array(got, sd["c_proj.bias"].expand(B, T, d), call=f"{call}: rank {rank}'s output", case=case,
                         what=f"rank {rank}'s output", against="c_proj.bias at every position, once",
                         diagnose=diagnose, **kata.tolerance("float64"))
