"""What is specific to the kv-quant kata: the facts its README teaches, tested on the installed
torch (the float8 cast, int8's wrap and truncation, the error bounds, KIVI's outlier channel, the
float32 accumulation the tolerance rests on), the grader's way of drawing values off the rounding
ties, and its failure paths on a learner's file."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.kv_quant import E4M3, INT8, MEMORY, SCHEDULES, absmax_scale, fill, off_ties
from reference.kv_quant import QuantKVCache, dequantize, quantize
from reference.kv_quant_bugs import BFloat16Cache, LowPrecisionCache

ZOO = Path(__file__).parent / "zoo" / "kv-quant"


def test_the_float8_cast_saturates_and_int8_wraps_and_truncates():
    big = torch.tensor([460.0, 480.0, 1000.0, float("inf"), -600.0])
    assert big.to(E4M3).float().tolist() == [448.0, 448.0, 448.0, 448.0, -448.0]
    assert torch.tensor([float("nan")]).to(E4M3).float().isnan().all()
    assert torch.finfo(E4M3).max == 448.0 and torch.finfo(E4M3).smallest_normal == 2.0 ** -6
    assert torch.tensor([2.0 ** -9]).to(E4M3).float().item() == 2.0 ** -9   # the smallest subnormal
    assert torch.tensor([200.0, -200.0]).to(INT8).tolist() == [-56, 56]   # modulo 256
    assert torch.tensor([3.9, -3.9]).to(INT8).tolist() == [3, -3]   # towards zero


def test_the_readme_bounds_hold_and_are_nearly_reached():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32))
    q, scale = quantize(x, INT8, axis=-1)
    err = (dequantize(q, scale) - x).abs()
    assert (err <= scale / 2 * (1 + 1e-5)).all() and (err / scale).max() > 0.49
    q, scale = quantize(x, E4M3, axis=-1)
    err = (dequantize(q, scale) - x).double().abs()
    bound = 2.0 ** -4 * x.double().abs() + 2.0 ** -10 * scale.double()
    assert (err <= bound * (1 + 1e-5)).all() and (err / bound).max() > 0.9


def test_an_outlier_key_channel_needs_a_scale_per_channel():
    """The README's KIVI paragraph: a channel twenty times the others leaves them at most
    127 / 20 ≈ 6 levels under a scale per token; per channel they keep their own scale's error."""
    torch.manual_seed(0)
    k = torch.rand(2, 4, 64, 16) * 2 - 1   # |k| < 1
    k[..., 5] = 20.0 * torch.sign(torch.randn(2, 4, 64))   # twenty times the others' largest
    others = [c for c in range(16) if c != 5]
    per_token = (dequantize(*quantize(k, INT8, axis=-1)) - k)[..., others].abs().max()
    per_channel = (dequantize(*quantize(k, INT8, axis=-2)) - k)[..., others].abs().max()
    assert per_token > 10 * per_channel
    levels = k[..., others].abs().amax(-1) / quantize(k, INT8, axis=-1)[1].squeeze(-1)
    assert 6 < levels.median() <= 127 / 20


def test_the_cache_holds_one_byte_an_element_and_its_scales():
    cache = QuantKVCache(INT8)
    for T in MEMORY["chunks"]:
        cache.append(torch.randn(1, 4, T, 64), torch.randn(1, 4, T, 64))
    codes = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    scales = sum(t.numel() * t.element_size() for t in cache.k_scale + cache.v_scale)
    assert (codes, scales) == (1_048_576, 40_960)   # the README's figures
    assert {t.dtype for t in cache.k + cache.v} == {INT8}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tolerance_float32_against_float64_and_float16_against_it(seed):
    """The manifest's figures: float32 attention over the dequantized cache is within 1.1e-7 of
    float64 beyond rtol 1e-5; float16 misses by 1.4e-4 at least, bfloat16 by 1.1e-3."""
    rng = np.random.default_rng(seed)
    for dtype, B, H, d, schedule in SCHEDULES:
        ops = fill(rng, dtype, B, H, d, schedule)
        caches = [cls(dtype) for cls in (QuantKVCache, LowPrecisionCache, BFloat16Cache)]
        for op in ops:
            if op[0] == "append":
                for cache in caches:
                    cache.append(op[1], op[2])
                continue
            ref = caches[0]
            k = torch.cat([dequantize(a, s) for a, s in zip(ref.k, ref.k_scale)], 2).double()
            v = torch.cat([dequantize(a, s) for a, s in zip(ref.v, ref.v_scale)], 2).double()
            q = op[1].double()
            Tq, Tk = q.shape[2], k.shape[2]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
            att = att.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq), float("-inf"))
            exact = att.softmax(-1) @ v
            got, half, bf = (cache.attend(op[1]).double() for cache in caches)
            assert ((got - exact).abs() - 1e-5 * exact.abs()).max() < 1e-5 / 50
            assert (half - exact).abs().max() > 1e-4 and (bf - exact).abs().max() > 1e-3


def test_off_ties_keeps_the_scale_and_moves_every_code_off_a_boundary():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((3, 5, 40)).astype(np.float32))
    for axis in (-1, -2):
        y = off_ties(x, absmax_scale(x, INT8, axis))
        _, scale = quantize(y, INT8, axis)
        assert torch.equal(y.abs().amax(axis), x.abs().amax(axis))
        u = y.double() / scale.double()
        frac = u - torch.floor(u)
        inner = u.abs() < 126.5
        assert ((frac[inner] - 0.5).abs() > 0.099).all() and (frac[inner] > 0.099).all() and (frac[inner] < 0.901).all()
        assert torch.equal(quantize(y, INT8, axis)[0], torch.round(y * (1 / scale)).to(INT8))


BROKEN = (ZOO / "hf_quantized_cache.py").read_text()


def edit(old, new, source):
    assert old in source, old
    return source.replace(old, new)


def test_a_broken_file_fails_each_check_with_its_own_sentence(grade_source):
    """dequantize answers None for int8 codes; quantize no pair for float8 and ignores a static
    scale; attend in float64 for a chunk and NaN for one token. The memory check still passes:
    nothing else is wrong with the cache."""
    source = edit("def dequantize(q, scale):\n    return q.to(torch.float32) * scale\n",
                  "def dequantize(q, scale):\n    return None if q.dtype == torch.int8 else q.to(torch.float32) * scale\n",
                  BROKEN)
    source = edit("    def _dequantize(self, qtensor):\n        return dequantize(*qtensor)\n",
                  "    def _dequantize(self, qtensor):\n        return qtensor[0].float() * qtensor[1]\n", source)
    source = edit("    bound = 127.0 if dtype == torch.int8 else 448.0\n",
                  "    if dtype != torch.int8:\n        return None\n    bound = 127.0\n    scale = None\n", source)
    source = edit("        return torch.matmul(attn_weights, value_states)\n",
                  "        out = torch.matmul(attn_weights, value_states)\n"
                  "        return out.double() if q_len > 1 else out * float('nan')\n", source)
    checks = checks_by_id(grade_source("kv-quant", source, seed=2))
    assert "wrong type" in checks["int8-roundtrip"]["message"] and "dequantize" in checks["int8-roundtrip"]["message"]
    assert "pair" in checks["float8-roundtrip"]["message"]
    assert "scale" in checks["static-scale-saturates"]["message"]
    assert "dtype" in checks["attend-matches"]["message"]
    assert "nan" in checks["decodes-token-by-token"]["message"].lower()
    assert [i for i, c in checks.items() if c["status"] == "passed"] == ["cache-bytes"]


def test_a_missing_dequantize_fails_only_the_round_trips(grade_source):
    source = edit("def dequantize(q, scale):\n    return q.to(torch.float32) * scale\n", "", BROKEN)
    source = edit("        return dequantize(*qtensor)\n", "        return qtensor[0].float() * qtensor[1]\n", source)
    checks = checks_by_id(grade_source("kv-quant", source, seed=2))
    assert [i for i, c in checks.items() if c["status"] != "passed"] == ["int8-roundtrip", "float8-roundtrip"]
    assert all("no 'dequantize'" in checks[i]["message"] for i in ("int8-roundtrip", "float8-roundtrip"))


def test_a_quantize_that_raises_says_which_call(grade_source):
    source = edit("    x = x.to(torch.float32)\n", "    x = x.to(torch.float32)\n    assert axis != 1\n", BROKEN)
    result = grade_source("kv-quant", source, seed=2)
    check = checks_by_id(result)["int8-roundtrip"]
    assert check["status"] == "failed" and "quantize(float32[3, 8, 4], torch.int8, 1)" in check["message"]
    assert [c["id"] for c in result["checks"] if c["status"] != "passed"] == ["int8-roundtrip"]
