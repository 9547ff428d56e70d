"""Hidden checks of the rope-scaling kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.rope_scaling import frequencies, judge_attention


def fresh(case_rng, rng, min_head_dim=16):
    """head_dim, base, factor and original context drawn from the ranges real models use."""
    hd = 2 * int(case_rng.integers(min_head_dim // 2, 65))
    base = float(case_rng.choice([10000.0, 500000.0, 1e6]))
    s = round(float(rng.uniform(2.0, 40.0)), 2)
    L = int(case_rng.choice([1024, 2048, 4096, 8192, 32768]))
    return hd, base, s, L


def test_yarn_at_fresh_configurations(learner, bugs, kata, case_rng, rng):
    """yarn_inv_freq at another head_dim, base, factor, original context and betas equals YaRN's code"""
    hd, base, s, L = fresh(case_rng, rng)
    fast, slow = float(case_rng.choice([32.0, 16.0, 64.0])), float(case_rng.choice([1.0, 2.0, 0.5]))
    frequencies(learner, bugs, kata, "yarn_inv_freq", (hd, base, s, L), {"beta_fast": fast, "beta_slow": slow},
                bugs.expected.yarn(hd, base, s, L, fast, slow),
                f"head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}, beta_fast {fast:g}, "
                f"beta_slow {slow:g}")


def test_llama3_at_fresh_configurations(learner, bugs, kata, case_rng, rng):
    """llama3_inv_freq at another head_dim, base, factor, original context and band factors equals Meta's apply_scaling"""
    # At head_dim >= 64 the pairs' wavelengths are at most 1e6^(2/64) = 1.54 apart, so a band
    # 4 or 8 wide always holds pairs to blend: every band mistake shows at every draw.
    hd, base, s, L = fresh(case_rng, rng, min_head_dim=64)
    low = float(case_rng.choice([1.0, 2.0]))
    high = low * float(case_rng.choice([4.0, 8.0]))
    frequencies(learner, bugs, kata, "llama3_inv_freq", (hd, base, s, L),
                {"low_freq_factor": low, "high_freq_factor": high},
                bugs.expected.apply_scaling(hd, base, s, L, low, high),
                f"head_dim {hd}, base {base:g}, factor {s:g}, original context {L:,}, low_freq_factor {low:g}, "
                f"high_freq_factor {high:g}")


def test_rope_attention_at_fresh_shapes(learner, bugs, kata, case_rng, rng, device):
    """rope_attention at another shape, other positions and another YaRN factor equals the expected attention"""
    H, T, hd = int(case_rng.integers(2, 5)), int(case_rng.integers(5, 12)), 2 * int(case_rng.integers(3, 9))
    s = round(float(rng.uniform(2.0, 40.0)), 2)
    start = int(case_rng.integers(0, 5000))
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 512}
    judge_attention(learner, bugs, kata, rng, device, 2, H, T, hd, list(range(start, start + T)), scaling,
                    bugs.expected.get_mscale(s), torch.float64)
