"""Hidden checks of the doc-masking kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.doc_masking import (DV, H, blame_upstream, cu, per_document, qkv, random_cu, randn, show,
                                 tolerances)
from graders.engine import expect


def output_of(result, *, call, case, shape):
    expect.type_of(result, torch.Tensor, call=call, case=case, what="the output")
    expect.that(tuple(result.shape) == shape, "The output has the wrong shape.", call=call, case=case,
                got=f"shape {tuple(result.shape)}", expected=f"shape {shape}")
    return result


def test_other_documents_do_not_matter(learner, bugs, kata, case_rng, rng):
    """changing other documents' tokens leaves a document's outputs unchanged (your packed_attention)"""
    # Only this property, judged on what your code answers: a packed attention with a wrong scale still
    # keeps its documents apart.
    cu_seqlens = random_cu(case_rng, 4)
    while sum(1 for a, b in zip(cu_seqlens.tolist()[:-1], cu_seqlens.tolist()[1:]) if b > a) < 3:
        cu_seqlens = random_cu(case_rng, 4)
    T = int(cu_seqlens[-1])
    q, k, v = qkv(rng, (H,), T)
    tol, loose = tolerances(kata, q.dtype)
    call = "packed_attention(q, k, v, cu_seqlens)"
    out = output_of(learner.packed_attention(q, k, v, cu_seqlens), call=call, case=show(cu_seqlens),
                    shape=(H, T, DV))
    bounds = cu_seqlens.tolist()
    for d, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end == start:
            continue
        q2, k2, v2 = randn(rng, H, T, q.size(-1)), randn(rng, H, T, k.size(-1)), randn(rng, H, T, DV)
        q2[..., start:end, :], k2[..., start:end, :], v2[..., start:end, :] = \
            q[..., start:end, :], k[..., start:end, :], v[..., start:end, :]
        case = f"{show(cu_seqlens)}; every token outside document {d} (tokens {start}..{end - 1}) redrawn"
        out2 = output_of(learner.packed_attention(q2, k2, v2, cu_seqlens), call=call, case=case, shape=out.shape)
        problem = expect.mismatch(out2[..., start:end, :], out[..., start:end, :], **tol)
        expect.that(problem is None, f"Changing only the other documents changed the output of document {d}: "
                    "its tokens attend to another document.", call=call, case=case, got=problem,
                    expected=f"the output of tokens {start}..{end - 1} unchanged",
                    diagnose=lambda: bugs.match(out, lambda impl: impl.packed_attention(q, k, v, cu_seqlens), **loose))
        others = torch.ones(T, dtype=torch.bool)
        others[start:end] = False
        # An output that ignores its inputs keeps every document apart too, and would pass for nothing.
        expect.that(expect.mismatch(out2[..., others, :], out[..., others, :], **tol) is not None,
                    "Redrawing the other documents left their outputs as they were: an output that does not "
                    "depend on q, k and v shows nothing about the mask.", call=call, case=case,
                    got="the other documents' outputs unchanged", expected="their outputs changed")


def test_prefix_packed_equals_per_document(learner, bugs, kata, case_rng, rng, device):
    """packed_attention with prefix_lens equals each document alone under its prefix-LM mask"""
    for cu_seqlens in (cu([0, 4, 9, 12]), random_cu(case_rng, 4)):
        n_docs = len(cu_seqlens) - 1
        prefix_lens = torch.from_numpy(case_rng.integers(0, 6, size=n_docs))
        q, k, v = qkv(rng, (H,), int(cu_seqlens[-1]))
        tol, loose = tolerances(kata, q.dtype)
        result = learner.packed_attention(q, k, v, cu_seqlens, prefix_lens)
        with blame_upstream(learner, bugs, cu_seqlens, kata.tolerance("float64")):
            expect.array(result, per_document(q, k, v, cu_seqlens, prefix_lens),
                         call="packed_attention(q, k, v, cu_seqlens, prefix_lens)",
                         case=f"q, k, v float64 ({H}, T, d); {show(cu_seqlens)}, "
                              f"prefix_lens = tensor({prefix_lens.tolist()})",
                         device=device, **tol, float32_inside=loose, against="SDPA on each document alone",
                         diagnose=lambda: bugs.match(
                             result, lambda impl: impl.packed_attention(q, k, v, cu_seqlens, prefix_lens), **loose))
