"""Hidden checks of the mla kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.mla import judge_decoding, normal, weights


def fresh_config(case_rng):
    """(B, d_model, n_heads, (kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim)) drawn from case_rng: an even
    kv_lora_rank larger than the per-head sizes, an even qk_nope_dim as in the public configs,
    qk_nope_dim != v_dim."""
    H, nope, rope = int(case_rng.integers(2, 6)), 2 * int(case_rng.integers(1, 4)), 2 * int(case_rng.integers(1, 5))
    v = int(case_rng.choice([n for n in range(2, 8) if n != nope]))
    r = 2 * int(case_rng.integers(4, 11))
    return int(case_rng.integers(2, 4)), 4 * int(case_rng.integers(4, 11)), H, (r, nope, rope, v)


def fresh_chunks(case_rng, T):
    """A prefill of 2 to 5 tokens, then chunks of 1 to 3 tokens that add up to T."""
    chunks = [int(case_rng.integers(2, 6))]
    while sum(chunks) < T:
        chunks.append(min(int(case_rng.integers(1, 4)), T - sum(chunks)))
    return tuple(chunks)


def test_decodes_fresh_configs(learner, bugs, kata, case_rng, rng, device):
    """other configurations and chunk schedules: decoding with the cache gives the module's own full forward (or, where that is wrong, the right one)"""
    B, d, H, dims = fresh_config(case_rng)
    chunks = fresh_chunks(case_rng, int(case_rng.integers(6, 11)))
    judge_decoding(learner, bugs, kata, device, weights(rng, d, H, *dims), H, dims,
                   normal(rng, B, sum(chunks), d), chunks, absorb=False)


def test_absorbed_fresh_configs(learner, bugs, kata, case_rng, rng, device):
    """other configurations and chunk schedules: the absorbed path decodes to what the naive path gives"""
    B, d, H, dims = fresh_config(case_rng)
    chunks = fresh_chunks(case_rng, int(case_rng.integers(6, 11)))
    judge_decoding(learner, bugs, kata, device, weights(rng, d, H, *dims, dtype=torch.float64), H, dims,
                   normal(rng, B, sum(chunks), d), chunks, absorb=True)
