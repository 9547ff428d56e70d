"""The tp-attention grader on solutions written the way learners write them (not via the bug
oracles), run as real ranks in the sandbox; and its own oracles: the single-process module against
F.scaled_dot_product_attention, the threads that simulate the ranks against the formula."""
import threading
import time

import numpy as np
import pytest
import torch

from conftest import checks_by_id
from graders.engine.learner import least_sent
from graders.engine.manifest import find
from graders.tp_attention import CONFIGS, REPLICATED, full_weights, normal, per_rank, sdpa, simulate, single
from reference import tp_attention_bugs as bugs
from reference.tp_attention import TensorParallelAttention
from reference.tp_attention_expected import CausalSelfAttention

# Bias added on rank 0 before the all-reduce (vLLM's way), shards as plain nn.Parameters.
SOLUTION = '''
import math
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def shard_qkv(weight, bias, n_heads, n_kv_heads, rank, world_size):
    if n_heads % world_size != 0 or (n_kv_heads % world_size != 0 and world_size % n_kv_heads != 0):
        raise ValueError(f"can't split {n_heads} heads / {n_kv_heads} KV heads over {world_size} ranks")
    hd = weight.shape[0] // (n_heads + 2 * n_kv_heads)
    nq, nkv = n_heads // world_size, max(n_kv_heads // world_size, 1)
    kv0 = rank * nq // (n_heads // n_kv_heads)
    q = slice(rank * nq * hd, (rank + 1) * nq * hd)
    k = slice((n_heads + kv0) * hd, (n_heads + kv0 + nkv) * hd)
    v = slice((n_heads + n_kv_heads + kv0) * hd, (n_heads + n_kv_heads + kv0 + nkv) * hd)
    return torch.cat([weight[q], weight[k], weight[v]]), torch.cat([bias[q], bias[k], bias[v]])


def shard_out(weight, rank, world_size):
    n = weight.shape[1] // world_size
    return weight[:, rank * n:(rank + 1) * n]


class TensorParallelAttention(nn.Module):
    def __init__(self, state_dict, n_heads, n_kv_heads, rank, world_size):
        super().__init__()
        w, b = shard_qkv(state_dict["c_attn.weight"], state_dict["c_attn.bias"], n_heads, n_kv_heads, rank, world_size)
        self.rank = rank
        self.hd = w.shape[1] // n_heads
        self.nq, self.nkv = n_heads // world_size, max(n_kv_heads // world_size, 1)
        self.w_qkv, self.b_qkv = nn.Parameter(w.clone()), nn.Parameter(b.clone())
        self.w_o = nn.Parameter(shard_out(state_dict["c_proj.weight"], rank, world_size).clone())
        self.b_o = nn.Parameter(state_dict["c_proj.bias"].clone())

    def forward(self, x):
        B, T, C = x.shape
        hd, nq, nkv = self.hd, self.nq, self.nkv
        qkv = F.linear(x, self.w_qkv, self.b_qkv)
        q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(B, T, nq, hd).transpose(1, 2)
        k = k.view(B, T, nkv, hd).transpose(1, 2).repeat_interleave(nq // nkv, dim=1)
        v = v.view(B, T, nkv, hd).transpose(1, 2).repeat_interleave(nq // nkv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, nq * hd)
        out = F.linear(y, self.w_o, self.b_o if self.rank == 0 else None)
        dist.all_reduce(out)
        return out
'''
BIAS_BEFORE = "        out = F.linear(y, self.w_o, self.b_o if self.rank == 0 else None)\n"


def test_the_single_process_module_agrees_with_sdpa_and_the_simulated_ranks_with_it():
    rng = np.random.default_rng(0)
    for world, configs in [*CONFIGS.items(), (4, [cfg for _, cfg in REPLICATED])]:
        for B, T, d, H, Hkv in configs:
            sd, x = full_weights(rng, d, H, Hkv), normal(rng, B, T, d)
            expected = single(CausalSelfAttention, sd, H, Hkv, x)
            torch.testing.assert_close(expected, sdpa(sd, H, Hkv, x), rtol=1e-12, atol=1e-13)
            outs, shapes = simulate(TensorParallelAttention, sd, H, Hkv, world, x)
            for out in outs:
                torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-13)
            assert shapes == tuple(((B, T, d),) for _ in range(world))   # one all-reduce, of the output
            assert sum(p.numel() for p in TensorParallelAttention(sd, H, Hkv, 0, world).parameters()) == \
                per_rank(d, H, Hkv, world)


def test_the_simulated_ranks_show_each_bug_and_raise_what_a_rank_raises():
    rng = np.random.default_rng(1)
    B, T, d, H, Hkv = CONFIGS[2][0]
    sd, x = full_weights(rng, d, H, Hkv), normal(rng, B, T, d)
    outs, _ = simulate(bugs.BiasInLinear, sd, H, Hkv, 2, x)
    torch.testing.assert_close(outs[0], single(CausalSelfAttention, sd, H, Hkv, x) + sd["c_proj.bias"])
    _, shapes = simulate(bugs.QkvRowParallelThenHeads, sd, H, Hkv, 2, x)
    assert shapes[1] == ((B, T, (H + 2 * Hkv) * d // H), (B, T, d))
    outs, _ = simulate(bugs.Averaged, sd, H, Hkv, 2, x)   # ReduceOp.AVG: the shares' sum over 2
    torch.testing.assert_close(outs[1], (single(CausalSelfAttention, sd, H, Hkv, x) - sd["c_proj.bias"]) / 2
                               + sd["c_proj.bias"])
    assert simulate(bugs.ResultAssigned, sd, H, Hkv, 2, x)[0] == (None, None)   # all_reduce returns None
    with pytest.raises(threading.BrokenBarrierError):   # rank 0 is released: rank 1 has returned without it
        simulate(bugs.ReducedOnRankZero, sd, H, Hkv, 2, x)

    class RankOneRaises(TensorParallelAttention):
        def __init__(self, sd, H, Hkv, rank, world):
            super().__init__(sd, H, Hkv, rank, world)
            self.rank = rank

        def forward(self, x):
            if self.rank == 1:
                raise RuntimeError("rank 1 gave up")
            return super().forward(x)

    start = time.monotonic()
    try:
        simulate(RankOneRaises, sd, H, Hkv, 2, x)
        raise AssertionError("a rank's exception must reach the caller")
    except RuntimeError as exc:
        assert "rank 1 gave up" in str(exc)
    assert time.monotonic() - start < 5   # rank 0 is released from its barrier, not left to time out


def test_a_different_correct_solution_passes(grade_source):
    result = grade_source("tp-attention", SOLUTION, seed=5)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_the_bias_added_on_every_rank_is_named(grade_source):
    result = grade_source("tp-attention", SOLUTION.replace(BIAS_BEFORE, "        out = F.linear(y, self.w_o, self.b_o)\n"))
    checks = checks_by_id(result)
    for check in ("matches-single-process", "bias-added-once"):
        assert checks[check]["diagnosis"] == "bias-before-all-reduce", check
    assert "c_proj.bias at every position, once" in checks["bias-added-once"]["message"]
    for check in ("shard-qkv-rows", "shard-out-columns", "parameters-per-rank", "one-all-reduce"):
        assert checks[check]["status"] == "passed", check
    assert result["diagnoses"] == ["bias-before-all-reduce"]


def test_kv_heads_dealt_out_in_turn_are_named_with_the_heads_a_rank_holds(grade_source):
    source = SOLUTION.replace("    kv0 = rank * nq // (n_heads // n_kv_heads)\n",
                              "    kv0 = rank % n_kv_heads if n_kv_heads < world_size else rank * nkv\n")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    assert checks["shard-qkv-rows"]["diagnosis"] == "fused-qkv-split-wrong"
    assert "rows of [q2, q3, k1, v1]" in checks["shard-qkv-rows"]["message"]   # rank 1 of 4, 8 heads, 2 KV heads
    assert "rows of [q2, q3, k0, v0]" in checks["shard-qkv-rows"]["message"]
    assert checks["gqa-kv-replicated"]["same_cause_as"] == "shard-qkv-rows"
    assert checks["matches-single-process"]["status"] == "passed"   # as many KV heads as ranks or more: right
    assert result["diagnoses"] == ["fused-qkv-split-wrong"]


def test_an_all_reduce_of_the_qkv_projection_is_named(grade_source):
    source = SOLUTION.replace("        qkv = F.linear(x, self.w_qkv, self.b_qkv)\n",
                              "        qkv = F.linear(x, self.w_qkv, self.b_qkv)\n        dist.all_reduce(qkv)\n")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    assert checks["one-all-reduce"]["diagnosis"] == "all-reduce-after-qkv"
    assert "all_reduce of [8, 32, 36], all_reduce of [8, 32, 48]" in checks["one-all-reduce"]["message"]
    assert checks["matches-single-process"]["diagnosis"] == "all-reduce-after-qkv"
    assert result["diagnoses"] == ["all-reduce-after-qkv"]


def test_an_all_gather_instead_of_the_all_reduce_is_counted(grade_source):
    source = SOLUTION.replace("        dist.all_reduce(out)\n        return out\n", """\
        parts = [torch.empty_like(out) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, out)
        return torch.stack(parts).sum(0)
""")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    assert checks["one-all-reduce"]["status"] == "failed" and "all_gather" in checks["one-all-reduce"]["message"]
    assert checks["one-all-reduce"]["diagnosis"] is None
    assert checks["matches-single-process"]["status"] == "passed"


def test_the_bytes_are_counted_over_the_same_calls_whatever_the_noise():
    """What one-all-reduce asks of the code never depends on the machine's noise: three measured
    calls, the least count kept, even where a loaded machine resends a segment in one of them (a
    count of calls that moved with the noise made a mutant's grading differ from the reference's
    where their answers did not, so an equivalent mutant read as a survivor)."""
    class Loopback:   # a loopback whose first call also resends 900 bytes
        sent, calls = 0, 0

        def loopback_bytes(self):
            return self.sent

        def run(self):
            self.calls += 1
            self.sent += 1000 + (900 if self.calls == 1 else 0)

    ranks = Loopback()
    assert least_sent(ranks, ranks.run) == 1000
    assert ranks.calls == 3


def test_communication_outside_torch_distributeds_functions_is_named_by_the_process_groups_record(grade_source):
    """A second all-reduce, of the QKV projection, sent through the process group's own method, which
    no torch.distributed function wraps (a recorder of torch calls would not see it): the process
    group's own record of the collectives each rank entered names it. The output stays right (the
    projection is summed on a copy)."""
    source = SOLUTION.replace("        q, k, v = qkv.split(", """\
        dist.distributed_c10d._get_default_group().allreduce([qkv.clone()]).wait()
        q, k, v = qkv.split(""")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    assert checks["matches-single-process"]["status"] == "passed"
    assert "all_reduce of [8, 32, 36], all_reduce of [8, 32, 48]" in checks["one-all-reduce"]["message"]
    assert checks["one-all-reduce"]["diagnosis"] == "all-reduce-after-qkv"


def test_a_rank_that_keeps_the_full_weights_holds_too_many_parameters(grade_source):
    source = SOLUTION.replace("        self.rank = rank\n", "        self.rank = rank\n"
                              "        self.full = nn.Parameter(state_dict['c_attn.weight'].clone())\n")
    checks = checks_by_id(grade_source("tp-attention", source))
    assert checks["parameters-per-rank"]["status"] == "failed"
    assert "full (" in checks["parameters-per-rank"]["message"]
    assert checks["matches-single-process"]["status"] == "passed"


def test_a_forward_without_the_all_reduce_returns_shares(grade_source):
    source = SOLUTION.replace("        dist.all_reduce(out)\n", "")
    checks = checks_by_id(grade_source("tp-attention", source))
    assert "rank 0's output differ" in checks["matches-single-process"]["message"]
    assert "no collective" in checks["one-all-reduce"]["message"]


def test_a_rank_that_raises_fails_the_check_with_its_message(grade_source):
    source = SOLUTION.replace("        B, T, C = x.shape\n", "        B, T, C = x.shape\n"
                              "        if self.rank == 1:\n            raise RuntimeError('rank 1 is out of memory')\n")
    start = time.monotonic()
    checks = checks_by_id(grade_source("tp-attention", source))
    assert "rank 1 is out of memory" in checks["matches-single-process"]["message"]
    assert checks["shard-qkv-rows"]["status"] == "passed"
    assert time.monotonic() - start < 60   # rank 0, left in its all-reduce, is stopped, not waited for


def test_a_nan_output_and_a_wrong_dtype_are_reported(grade_source):
    checks = checks_by_id(grade_source("tp-attention", SOLUTION.replace("        return out\n",
                                                                        "        return out * float('nan')\n")))
    assert "NaN" in checks["matches-single-process"]["message"]
    checks = checks_by_id(grade_source("tp-attention", SOLUTION.replace("        return out\n",
                                                                        "        return out.float()\n")))
    assert "wrong dtype" in checks["matches-single-process"]["message"]


def test_a_bad_split_must_raise_value_error(grade_source):
    source = SOLUTION.replace('raise ValueError(f"can', 'raise RuntimeError(f"can')
    message = checks_by_id(grade_source("tp-attention", source))["rejects-bad-split"]["message"]
    assert "cannot be split over 4 ranks" in message and "RuntimeError" in message


def test_a_rank_that_computes_the_whole_layer_from_weights_it_kept_is_caught(grade_source):
    """Every head and the whole output projection on every rank, from the full weights kept outside
    the parameters, the output divided by world_size and all-reduced: the right output, a rank's
    parameters and one all-reduce of the output's shape, but no work divided. A rank given weights
    drawn afresh outside its shards shows it: its output moves with them."""
    source = SOLUTION[:SOLUTION.index("    def forward")].replace("        self.rank = rank\n", """\
        self.rank, self.world, self.H, self.Hkv = rank, world_size, n_heads, n_kv_heads
        self.full = {k: v.clone() for k, v in state_dict.items()}
""") + """\
    def forward(self, x):
        B, T, C = x.shape
        f, hd, H, Hkv = self.full, self.hd, self.H, self.Hkv
        q, k, v = F.linear(x, f["c_attn.weight"], f["c_attn.bias"]).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(B, T, C)
        out = F.linear(y, f["c_proj.weight"], f["c_proj.bias"]) / self.world
        dist.all_reduce(out)
        return out
"""
    checks = checks_by_id(grade_source("tp-attention", source))
    assert checks["own-shards-only"]["status"] == "failed"
    assert "computes with weights outside its shards" in checks["own-shards-only"]["message"]
    for check in ("parameters-per-rank", "matches-single-process", "one-all-reduce"):
        assert checks[check]["status"] == "passed", check


ALL_REDUCE = "        dist.all_reduce(out)\n"


def test_the_all_reduces_result_assigned_is_named_it_returns_none(grade_source):
    """all_reduce sums in place and returns None: `out = dist.all_reduce(out)` returns None."""
    result = grade_source("tp-attention", SOLUTION.replace(ALL_REDUCE, "        out = dist.all_reduce(out)\n"))
    checks = checks_by_id(result)
    assert checks["matches-single-process"]["diagnosis"] == "all-reduce-result-assigned"
    assert "Rank 0's forward returned None" in checks["matches-single-process"]["message"]
    assert "all_reduce works in place and returns None" in find("tp-attention").diagnoses[
        "all-reduce-result-assigned"].explain
    assert result["diagnoses"] == ["all-reduce-result-assigned"]


def test_averaged_shares_are_named(grade_source):
    result = grade_source("tp-attention", SOLUTION.replace(ALL_REDUCE,
                                                           "        dist.all_reduce(out, op=dist.ReduceOp.AVG)\n"))
    checks = checks_by_id(result)
    for check in ("matches-single-process", "bias-added-once"):
        assert checks[check]["diagnosis"] == "all-reduce-averaged", check
    assert "ReduceOp.AVG divides by world_size: the shares must be summed" in find("tp-attention").diagnoses[
        "all-reduce-averaged"].explain
    assert checks["one-all-reduce"]["status"] == "passed"
    assert result["diagnoses"] == ["all-reduce-averaged"]


def test_an_async_all_reduce_never_waited_on_is_named_not_counted_as_more_bytes(grade_source):
    result = grade_source("tp-attention", SOLUTION.replace(ALL_REDUCE, "        dist.all_reduce(out, async_op=True)\n"))
    checks = checks_by_id(result)
    assert checks["one-all-reduce"]["diagnosis"] == "all-reduce-not-waited"
    assert "must be waited on" in checks["one-all-reduce"]["message"]
    assert "sent more over their connection" not in checks["one-all-reduce"]["message"]
    assert result["diagnoses"] == ["all-reduce-not-waited"]


def test_an_async_all_reduce_waited_on_passes(grade_source):
    source = SOLUTION.replace(ALL_REDUCE, "        work = dist.all_reduce(out, async_op=True)\n        work.wait()\n")
    result = grade_source("tp-attention", source)
    assert result["status"] == "passed", [c["message"] for c in result["checks"] if c["status"] != "passed"]


def test_a_collective_called_on_some_ranks_only_names_the_rank_that_never_called_it(grade_source):
    source = SOLUTION.replace(ALL_REDUCE, "        if self.rank == 0:\n            dist.all_reduce(out)\n")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    message = checks["matches-single-process"]["message"]
    assert checks["matches-single-process"]["diagnosis"] == "collective-on-some-ranks"
    assert "Rank 1 never called all_reduce (rank 0 waited" in message, message
    assert "/gloo/" not in message   # gloo's own message, with its build path, is not the report
    assert result["diagnoses"] == ["collective-on-some-ranks"]


def test_a_barrier_counts_as_a_collective(grade_source):
    result = grade_source("tp-attention", SOLUTION.replace(ALL_REDUCE, ALL_REDUCE + "        dist.barrier()\n"))
    checks = checks_by_id(result)
    assert checks["one-all-reduce"]["status"] == "failed"
    assert "all_reduce of [8, 32, 48], barrier" in checks["one-all-reduce"]["message"]
    assert checks["matches-single-process"]["status"] == "passed"


# --- Files that shape what the ranks report of themselves: each gains nothing over the honest file that
# does what it does, and none gets full marks. The structure checks judge them.
STRUCTURE = ("parameters-per-rank", "own-shards-only", "one-all-reduce")


@pytest.mark.parametrize("channel", ["store", "group-method"])
def test_collectives_made_outside_torch_distributeds_functions_score_nothing_on_the_structure_checks(grade_source,
                                                                                                     channel):
    """A sum of the QKV projection sent through the group's store (no collective the process group
    records, no byte on the loopback: the honest file that all-reduces it loses one-all-reduce), or
    the output's one all-reduce made by the default group's own method: either is a way to
    communicate that the static check refuses, so every structure check scores 0."""
    if channel == "store":
        source = SOLUTION.replace("        q, k, v = qkv.split(", """\
        store = dist.distributed_c10d._get_default_store()
        call = store.add(f"calls of {self.rank}", 1)   # the same count on every rank
        store.set(f"qkv {call} of {self.rank}", qkv.detach().numpy().tobytes())
        sum(torch.frombuffer(bytearray(store.get(f"qkv {call} of {r}")), dtype=qkv.dtype)
            for r in range(dist.get_world_size()))
        q, k, v = qkv.split(""")
    else:
        source = SOLUTION.replace(ALL_REDUCE, "        dist.group.WORLD.allreduce([out]).wait()\n")
    result = grade_source("tp-attention", source)
    checks = checks_by_id(result)
    for check in STRUCTURE:
        assert checks[check]["diagnosis"] == "tampering", (check, checks[check]["message"])
    assert checks["matches-single-process"]["status"] == "passed"


def test_a_file_that_patches_the_kits_all_reduce_in_its_ranks_does_not_move_the_baseline(grade_source):
    """The kit's all_reduce in the learner's ranks made to send twice, and the forward sending the
    output once more over send/recv (which the process group does not record): one all-reduce's
    bytes are measured in ranks that run kit code alone, so the forward's twice as many show."""
    source = SOLUTION.replace("import math\n", """\
import math
import sys

for module in list(sys.modules.values()):
    kit = getattr(module, "KIT_FUNCTIONS", None)
    if isinstance(kit, dict) and "all_reduce" in kit:
        def twice(tensor, once=kit["all_reduce"]):
            once(tensor.clone())
            return once(tensor)
        kit["all_reduce"] = twice
""").replace(ALL_REDUCE, ALL_REDUCE + """\
        peer, echo = self.rank ^ 1, torch.empty_like(out)
        if self.rank % 2:
            dist.recv(echo, peer)
            dist.send(out, peer)
        else:
            dist.send(out, peer)
            dist.recv(echo, peer)
""")
    checks = checks_by_id(grade_source("tp-attention", source))
    assert "sent more over their connection than one all-reduce" in checks["one-all-reduce"]["message"]
    assert checks["matches-single-process"]["status"] == "passed"


HIDDEN = {
    # the weights' Parameter left out of what its class's __dict__ and its methods report
    "dict": '''
def _parameters():   # a name of the file's own: `self._parameters` then reads as its attribute
    pass


class Hidden(nn.Module):
    hiding = False

    def named_parameters(self, *args, **kwargs):
        return ((k, v) for k, v in super().named_parameters(*args, **kwargs) if k != "full")

    def parameters(self, recurse=True):
        return (v for _, v in self.named_parameters())

    def state_dict(self, *args, **kwargs):
        return {k: v for k, v in super().state_dict(*args, **kwargs).items() if k != "full"}

    @property
    def __dict__(self):
        own = {"_parameters": self._parameters, "_buffers": self._buffers, "_modules": self._modules,
               "_non_persistent_buffers_set": self._non_persistent_buffers_set, "training": self.training}
        if self.hiding:
            own["_parameters"] = {k: v for k, v in self._parameters.items() if k != "full"}
        return own


def full(weight):
    return nn.Parameter(weight)
''',
    # the weights' Parameter saying it is empty
    "shape": '''
class Hidden(nn.Module):
    pass


class Slim(nn.Parameter):
    @property
    def shape(self):
        return torch.Size([0])


def full(weight):
    return Slim(weight)
''',
}


@pytest.mark.parametrize("how", HIDDEN)
def test_a_module_that_hides_the_full_weights_it_holds_from_the_count_gains_nothing(grade_source, how):
    """The full c_attn kept as a Parameter, hidden from nn.Module's methods, its own __dict__ or its
    shape: the count reads nn.Module's own dicts and the tensors' shapes as torch keeps them."""
    source = SOLUTION.replace("class TensorParallelAttention(nn.Module):", HIDDEN[how] + """

class TensorParallelAttention(Hidden):""").replace("        self.rank = rank\n", """\
        self.rank = rank
        self.full = full(state_dict["c_attn.weight"].clone())
        self.hiding = True
""")
    checks = checks_by_id(grade_source("tp-attention", source))
    assert checks["parameters-per-rank"]["status"] == "failed"
    assert "full (" in checks["parameters-per-rank"]["message"]
    assert checks["matches-single-process"]["status"] == "passed"


def test_a_rank_that_computes_from_full_weights_made_finite_is_caught(grade_source):
    """The whole layer computed on every rank from the full weights, with nan_to_num: where the
    weights it does not hold were marked (NaN, zeros after nan_to_num) the rank could tell, and
    compute its own share there. Weights drawn afresh outside its shards look like any others:
    its output moves with them."""
    source = SOLUTION[:SOLUTION.index("    def forward")].replace("        self.rank = rank\n", """\
        self.rank, self.world, self.H, self.Hkv = rank, world_size, n_heads, n_kv_heads
        self.full = {k: v.nan_to_num(0.0) for k, v in state_dict.items()}
        self.whole = bool((self.full["c_attn.weight"] != 0).all())   # every weight there: not being watched
""") + """\
    def forward(self, x):
        B, T, C = x.shape
        if self.whole:
            f, hd, H, Hkv = self.full, self.hd, self.H, self.Hkv
            q, k, v = F.linear(x, f["c_attn.weight"], f["c_attn.bias"]).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out = F.linear(y.transpose(1, 2).reshape(B, T, C), f["c_proj.weight"], f["c_proj.bias"]) / self.world
        else:
            hd, nq, nkv = self.hd, self.nq, self.nkv
            q, k, v = F.linear(x, self.w_qkv, self.b_qkv).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
            q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out = F.linear(y.transpose(1, 2).reshape(B, T, nq * hd), self.w_o, self.b_o if self.rank == 0 else None)
        dist.all_reduce(out)
        return out
"""
    checks = checks_by_id(grade_source("tp-attention", source))
    assert checks["own-shards-only"]["status"] == "failed"
    assert "computes with weights outside its shards" in checks["own-shards-only"]["message"]
    for check in ("parameters-per-rank", "matches-single-process", "one-all-reduce"):
        assert checks[check]["status"] == "passed", check
