"""Grader of the tp-attention kata (katas/tp-attention/README.md).

The learner's file runs as the ranks of one torch.distributed group inside its sandbox
(``learner.ranks(world)``); the reference and the bug oracles, trusted, run here as threads whose
all-reduce sums through a barrier (``simulate``), so a wrong output can be named.
"""
import threading
from math import prod
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.learner import CollectiveNotJoined, least_sent
from graders.engine.recording import recorded
from graders.engine.structure import check_untampered
from graders.engine.weights import listing, normal

# (B, T, d_model, n_heads, n_kv_heads) per world size: several KV heads per rank and as many KV
# heads as ranks. head_dim (6, 6, 5, 6) differs from n_heads and T, so a split by the wrong size shows.
CONFIGS = {2: [(2, 6, 24, 4, 4), (2, 5, 48, 8, 2)], 4: [(2, 6, 40, 8, 8), (2, 5, 48, 8, 4)]}
# Fewer KV heads than ranks: each KV head on world // n_kv_heads ranks; with 2 KV heads over 4
# ranks, dealing them out in turn (0, 1, 0, 1) differs from the right 0, 0, 1, 1.
REPLICATED = [(4, (2, 5, 48, 8, 2)), (2, (3, 5, 20, 4, 1)), (4, (3, 5, 20, 4, 1))]
CASE = ("x: {dtype} ({B}, {T}, {d}), standard normal, the same on every rank; the full layer's weights "
        "W ~ N(0, 1/{d}), biases ~ N(0, 1); n_heads={H}, n_kv_heads={Hkv}, world_size={world}")
CALL = "TensorParallelAttention(state_dict, {H}, {Hkv}, rank, {world})(x) on each of the {world} ranks"


def full_weights(rng, d, H, Hkv, dtype=torch.float64):
    """The single-process layer's state_dict: W ~ N(0, 1/d) keeps q, k, v near unit variance;
    biases ~ N(0, 1), so that a bias counted twice moves the output by O(1)."""
    rows = (H + 2 * Hkv) * (d // H)
    sd = {"c_attn.weight": normal(rng, rows, d, std=d ** -0.5), "c_attn.bias": normal(rng, rows),
          "c_proj.weight": normal(rng, d, d, std=d ** -0.5), "c_proj.bias": normal(rng, d)}
    return {k: v.to(dtype) for k, v in sd.items()}


def per_rank(d, H, Hkv, world):
    """Parameters one rank holds: its c_attn rows and their bias, its c_proj columns, c_proj's bias."""
    hd, kv = d // H, max(Hkv // world, 1)
    return (H // world + 2 * kv) * hd * (d + 1) + d * (d // world) + d


@recorded
def single(cls, sd, H, Hkv, x):
    """The single-process module (CausalSelfAttention of reference/tp_attention_expected.py) with the
    full weights, in float64."""
    with torch.no_grad():
        m = cls(x.shape[-1], H, Hkv).double()
        m.load_state_dict({k: v.double() for k, v in sd.items()})
        return m(x.double()).to(x.dtype)


def sdpa(sd, H, Hkv, x):
    """The same layer through F.scaled_dot_product_attention(enable_gqa=True), in float64: torch's
    own causal attention and grouping of query heads onto KV heads."""
    B, T, d = x.shape
    hd, w = d // H, {k: v.double() for k, v in sd.items()}
    q, k, v = (x.double() @ w["c_attn.weight"].T + w["c_attn.bias"]).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    heads = lambda t: t.view(B, T, -1, hd).transpose(1, 2)   # (B, heads, T, hd)
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True, enable_gqa=True)
    return (y.transpose(1, 2).reshape(B, T, d) @ w["c_proj.weight"].T + w["c_proj.bias"]).to(x.dtype)


@recorded
def simulate(cls, sd, H, Hkv, world, x):
    """A trusted TensorParallelAttention (the reference's or a bug's) run here, each rank a thread
    whose dist.all_reduce sums (or, with ReduceOp.AVG, averages) through a barrier: (every rank's
    output, the shapes each all-reduced). A rank that waits for an all-reduce a finished rank never
    called raises at once, as one that raises releases the others."""
    barrier, slots, local = threading.Barrier(world, timeout=30), [None] * world, threading.local()
    outs, shapes, errors = [None] * world, [[] for _ in range(world)], []
    lock, entered, done = threading.Lock(), [0] * world, [False] * world

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, async_op=False):
        with lock:
            entered[local.rank] += 1
            if any(done[r] and entered[r] < entered[local.rank] for r in range(world)):
                barrier.abort()   # the rank it waits for has returned: it never comes
        slots[local.rank] = t.clone()
        shapes[local.rank].append(tuple(t.shape))
        barrier.wait()
        total = sum(slots[1:], slots[0].clone())
        barrier.wait()   # every rank has read every slot before any writes its sum back
        t.copy_(total / world if op == dist.ReduceOp.AVG else total)
        return SimpleNamespace(wait=lambda: True) if async_op else None   # summed already: waiting is free

    def run(rank):
        local.rank = rank
        try:
            with torch.no_grad():
                outs[rank] = cls({k: v.clone() for k, v in sd.items()}, H, Hkv, rank, world)(x.clone())
        except Exception as exc:   # noqa: BLE001  a bug may raise: the others must not wait for it
            errors.append(exc)
            barrier.abort()
        with lock:
            done[rank] = True
            if any(entered[r] > entered[rank] for r in range(world) if not done[r]):
                barrier.abort()   # a rank waits in an all-reduce this one never called

    with mock.patch.multiple(dist, all_reduce=all_reduce, get_rank=lambda group=None: local.rank,
                             get_world_size=lambda group=None: world):
        threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return tuple(outs), tuple(tuple(s) for s in shapes)


@recorded
def oracle_params(cls, sd, H, Hkv, rank, world):
    """How many parameters a trusted module holds on ``rank`` (built here: building needs no group)."""
    return sum(p.numel() for p in cls(sd, H, Hkv, rank, world).parameters())


def heads_of(rows, sd, H, Hkv) -> str:
    """Which heads of the full c_attn the returned rows copy, e.g. [q2, q3, k1, v1]: the shard at a glance."""
    hd = sd["c_attn.weight"].shape[0] // (H + 2 * Hkv)
    names = [f"q{h}" for h in range(H)] + [f"k{g}" for g in range(Hkv)] + [f"v{g}" for g in range(Hkv)]
    full = sd["c_attn.weight"].view(H + 2 * Hkv, hd, -1)
    found = []
    for i in range(rows.shape[0] // hd):
        block = rows[i * hd:(i + 1) * hd].to(full.dtype)
        found.append(next((n for n, f in zip(names, full) if torch.equal(block, f)), "?"))
    return "[" + ", ".join(found) + "]"


def shard_case(d, H, Hkv, world, dtype=torch.float64):
    return (f"c_attn.weight: {str(dtype).removeprefix('torch.')} ({(H + 2 * Hkv) * (d // H)}, {d}) = rows [W_q; W_k; "
            f"W_v] of {H} query heads and {Hkv} KV heads of head_dim {d // H}, and its bias")


def check_shard(learner, bugs, sd, H, Hkv, rank, world):
    """shard_qkv for one rank: a pair of tensors equal to the reference's rows, exactly (they are copies)."""
    d = sd["c_attn.weight"].shape[1]
    call, case = f"shard_qkv(weight, bias, {H}, {Hkv}, {rank}, {world})", shard_case(d, H, Hkv, world)
    got = learner.shard_qkv(sd["c_attn.weight"], sd["c_attn.bias"], H, Hkv, rank, world)
    expect.that(isinstance(got, (tuple, list)) and len(got) == 2, "shard_qkv must return a pair (weight_rows, "
                "bias_rows).", call=call, case=case, got=type(got).__name__, expected="a tuple of two tensors")
    want_w, want_b = bugs.reference.shard_qkv(sd["c_attn.weight"], sd["c_attn.bias"], H, Hkv, rank, world)
    diagnose = lambda: bugs.match(tuple(got), lambda impl: tuple(impl.shard_qkv(
        sd["c_attn.weight"], sd["c_attn.bias"], H, Hkv, rank, world)), rtol=0, atol=0)
    w, b = got
    if type(w) is torch.Tensor and w.shape == want_w.shape and w.dtype == want_w.dtype:
        held, wanted = heads_of(w, sd, H, Hkv), heads_of(want_w, sd, H, Hkv)
        expect.that(held == wanted, f"Rank {rank}'s rows are the wrong heads' rows: it needs its query heads' rows, "
                    "then the rows of the KV heads they read, keys then values.", call=call, case=case,
                    got=f"rows of {held}", expected=f"rows of {wanted}", diagnose=diagnose)
    expect.array(w, want_w, call=call, case=case, rtol=0, atol=0, what="the weight rows", diagnose=diagnose)
    expect.array(b, want_b, call=call, case=case, rtol=0, atol=0, what="the bias rows", diagnose=diagnose)


def test_shard_qkv_rows(learner, bugs, rng):
    """shard_qkv returns this rank's [q; k; v] rows and bias rows exactly, at 2 and 4 ranks, KV heads split and replicated"""
    for world, (d, H, Hkv) in ((2, (24, 4, 4)), (2, (48, 8, 2)), (4, (40, 8, 8)), (4, (48, 8, 2)), (4, (20, 4, 1))):
        sd = full_weights(rng, d, H, Hkv)
        for rank in range(world):
            check_shard(learner, bugs, sd, H, Hkv, rank, world)
    sd = full_weights(rng, 24, 4, 2, torch.float32)   # a copy keeps the dtype
    check_shard(learner, bugs, sd, 4, 2, 1, 2)


def test_shard_out_columns(learner, bugs, rng):
    """shard_out returns this rank's input columns of W_o exactly"""
    for world, d in ((2, 24), (4, 40)):
        w = normal(rng, d, d)
        for rank in range(world):
            call = f"shard_out(weight, {rank}, {world})"
            case = f"weight: float64 ({d}, {d}), c_proj's (out_features, in_features)"
            got = learner.shard_out(w, rank, world)
            expect.array(got, bugs.reference.shard_out(w, rank, world), call=call, case=case, rtol=0, atol=0,
                         against=f"weight[:, {rank * d // world}:{(rank + 1) * d // world}], the columns that "
                                 f"multiply rank {rank}'s heads' outputs",
                         diagnose=lambda: bugs.match(got, lambda impl: impl.shard_out(w, rank, world), rtol=0, atol=0))


def test_rejects_bad_split(learner, rng):
    """a split into partial heads (world_size not dividing n_heads, or 3 KV heads over 2 ranks) raises ValueError"""
    sd = full_weights(rng, 24, 4, 2)
    learner.shard_qkv(sd["c_attn.weight"], sd["c_attn.bias"], 4, 2, 0, 4)   # a valid split works: only bad ones raise
    for d, H, Hkv, world, why in ((24, 6, 6, 4, "6 query heads cannot be split over 4 ranks"),
                                  (36, 6, 3, 2, "3 KV heads can be neither split over 2 ranks nor replicated evenly")):
        sd = full_weights(rng, d, H, Hkv)
        expect.refused(lambda: learner.shard_qkv(sd["c_attn.weight"], sd["c_attn.bias"], H, Hkv, 0, world),
                       call=f"shard_qkv(weight, bias, {H}, {Hkv}, 0, {world})", case=shard_case(d, H, Hkv, world),
                       expected="ValueError: a rank holds whole heads", raised=f"{why}, but the error raised is not "
                       "the expected one.", returned=f"{why}, yet shards were returned.")


def each(ranks, fn) -> list:
    """ranks.each(fn), a collective that some rank never called named as the mistake it is."""
    try:
        return ranks.each(fn)
    except CollectiveNotJoined as exc:
        exc.diagnosis = "collective-on-some-ranks"
        raise


def build(ranks, sd, H, Hkv, world):
    """The learner's module on every rank, from the full weights."""
    return each(ranks, lambda r, L: L.TensorParallelAttention(sd, H, Hkv, r, world))


def test_parameters_per_rank(learner, bugs, rng):
    """each rank holds exactly its shards' parameters: 1/world_size of the layer but the copied KV heads and the output bias"""
    for world, (B, T, d, H, Hkv) in ((2, CONFIGS[2][0]), REPLICATED[0]):
        sd = full_weights(rng, d, H, Hkv)
        ranks = learner.ranks(world)
        mods = build(ranks, sd, H, Hkv, world)
        infos = ranks.each(lambda r, L: L.module_info(mods[r]))
        expected = per_rank(d, H, Hkv, world)
        kv = max(Hkv // world, 1)
        for rank, info in enumerate(infos):
            params = {name: entry[0] for name, entry in info["parameters"].items()}
            count = sum(prod(shape) for shape in params.values())
            expect.that(count == expected, f"Rank {rank} holds the wrong number of parameters.",
                        call=f"TensorParallelAttention(state_dict, {H}, {Hkv}, {rank}, {world})",
                        case=f"d_model={d}, n_heads={H}, n_kv_heads={Hkv}, head_dim={d // H}",
                        got=f"{count:,} ({listing(params)})",
                        expected=f"({H // world} query + 2·{kv} KV heads)·{d // H}·({d} + 1) for its c_attn rows and "
                                 f"their bias + {d}·{d // world} for its c_proj columns + {d} for c_proj's bias = "
                                 f"{expected:,}",
                        diagnose=lambda: bugs.match(count, lambda impl: oracle_params(impl.TensorParallelAttention, sd,
                                                                                     H, Hkv, rank, world), rtol=0, atol=0))
    check_untampered(learner, call=f"TensorParallelAttention(state_dict, {H}, {Hkv}, rank, {world})",
                     case=f"d_model={d}, n_heads={H}, n_kv_heads={Hkv}, head_dim={d // H}")


def forward_all(ranks, mods, x, *, call, case):
    """Every rank's forward of x at once: the outputs, and the collectives each rank entered in it as
    its process group recorded them ([(name, shape of the first tensor)], a barrier's shape None). An
    async collective left unwaited fails here: the outputs are read before its sum lands, or after."""
    before = ranks.collectives()
    outs = each(ranks, lambda r, L: mods[r](x))
    after = ranks.collectives([b["entered"][-1][0] if b["entered"] else -1 for b in before])
    for rank, (b, a) in enumerate(zip(before, after)):
        expect.that(a["unwaited"] == b["unwaited"], f"Rank {rank} returned with an async collective never waited "
                    "on: an async all_reduce must be waited on (`work.wait()`) before its tensor is read, or the "
                    "output is read while the sum is still being written into it.", call=call, case=case,
                    got=f"{a['unwaited'] - b['unwaited']} collective(s) with async_op=True whose work nobody waited on",
                    expected="every collective finished before forward returns",
                    diagnose=lambda: "all-reduce-not-waited")
    return outs, [[(name, tuple(shape) if shape else None) for _, name, shape in a["entered"]] for a in after]


def returned(outs, call, case, diagnose=None):
    """Every rank's forward returned a value: None is what all_reduce returns, named before its type."""
    for rank, got in enumerate(outs):
        expect.that(got is not None, f"Rank {rank}'s forward returned None.", call=f"{call}: rank {rank}'s output",
                    case=case, got="None", expected="a torch.Tensor, the full (B, T, d_model) output",
                    diagnose=diagnose)


def compare(ranks, bugs, kata, rng, world, cfg, *, dtype=torch.float64):
    """Every rank's output against the single-process module and SDPA, naming the known bug it matches."""
    B, T, d, H, Hkv = cfg
    sd, x = full_weights(rng, d, H, Hkv, dtype), normal(rng, B, T, d).to(dtype)
    call = CALL.format(H=H, Hkv=Hkv, world=world)
    case = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, T=T, d=d, H=H, Hkv=Hkv, world=world)
    outs, _ = forward_all(ranks, build(ranks, sd, H, Hkv, world), x, call=call, case=case)
    tol = kata.tolerance(dtype)
    diagnose = lambda: bugs.match(tuple(outs), lambda impl: simulate(impl.TensorParallelAttention, sd, H, Hkv, world,
                                                                      x)[0], **kata.tolerance("float32"))
    returned(outs, call, case, diagnose)
    for expected, against in ((single(bugs.expected.CausalSelfAttention, sd, H, Hkv, x),
                               "the single-process CausalSelfAttention with the full weights"),
                              (sdpa(sd, H, Hkv, x), "F.scaled_dot_product_attention(enable_gqa=True) with the full weights")):
        for rank, got in enumerate(outs):
            expect.array(got, expected, call=f"{call}: rank {rank}'s output", case=case, what=f"rank {rank}'s output",
                         diagnose=diagnose, against=against, **tol)


def test_matches_single_process(learner, bugs, kata, rng):
    """every rank's output equals the single-process module's at 2 and 4 ranks"""
    for world, configs in CONFIGS.items():
        ranks = learner.ranks(world)
        for cfg in configs:
            compare(ranks, bugs, kata, rng, world, cfg)
        if world == 2:
            compare(ranks, bugs, kata, rng, world, configs[1], dtype=torch.float32)


def redrawn(rng, reference, sd, H, Hkv, rank, world):
    """``sd`` as rank ``rank`` may read it: every weight outside its shards (the rows of c_attn and
    of its bias that the reference's shard_qkv does not give it, the columns of c_proj that its
    shard_out does not) drawn afresh as full_weights draws them, so that nothing tells them from the
    layer's own; its shards, and c_proj's bias, which every rank holds, as they are. A mark such as
    NaN would be seen, and a rank could compute its own share where it is and more elsewhere."""
    rows, d = sd["c_attn.weight"].shape
    index = torch.arange(rows, dtype=torch.float64)
    held = torch.zeros(rows, dtype=torch.bool)
    held[reference.shard_qkv(index[:, None], index, H, Hkv, rank, world)[1].long()] = True
    cols = torch.zeros(d, dtype=torch.bool)
    cols[reference.shard_out(torch.arange(d, dtype=torch.float64)[None, :], rank, world)[0].long()] = True
    fresh = full_weights(rng, d, H, Hkv)
    return {"c_attn.weight": torch.where(held[:, None], sd["c_attn.weight"], fresh["c_attn.weight"]),
            "c_attn.bias": torch.where(held, sd["c_attn.bias"], fresh["c_attn.bias"]),
            "c_proj.weight": torch.where(cols, sd["c_proj.weight"], fresh["c_proj.weight"]),
            "c_proj.bias": sd["c_proj.bias"]}


def test_own_shards_only(learner, bugs, kata, rng):
    """each rank computes from its own shards alone: the weights it does not hold, drawn afresh, change nothing"""
    tol = kata.tolerance("float64")
    for world, (B, T, d, H, Hkv) in ((2, CONFIGS[2][1]), REPLICATED[0]):
        sd, x = full_weights(rng, d, H, Hkv), normal(rng, B, T, d)
        call = CALL.format(H=H, Hkv=Hkv, world=world).replace("state_dict", "state_dict_of_rank")
        case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, Hkv=Hkv, world=world) + \
            "; each rank's state_dict drawn afresh outside its shards (other heads' rows of c_attn, other columns " \
            "of c_proj), twice: two modules on each rank"
        ranks = learner.ranks(world)
        outs = []
        for _ in range(2):
            mine = [redrawn(rng, bugs.reference, sd, H, Hkv, rank, world) for rank in range(world)]
            before = ranks.collectives()
            mods = each(ranks, lambda r, L: L.TensorParallelAttention(mine[r], H, Hkv, r, world))
            built = ranks.collectives([b["entered"][-1][0] if b["entered"] else -1 for b in before])
            for rank, entered in enumerate(b["entered"] for b in built):
                expect.that(not entered, f"Rank {rank} communicated while it was built: a rank takes its shards from "
                            "the state_dict it is given, and needs nothing of the others' until its forward.",
                            call=f"TensorParallelAttention(state_dict_of_rank, {H}, {Hkv}, rank, {world}) on each of "
                                 f"the {world} ranks", case=case,
                            got=", ".join(f"{name} of {shape}" if shape else name for _, name, shape in entered),
                            expected="no collective")
            outs.append(forward_all(ranks, mods, x, call=call, case=case)[0])
            returned(outs[-1], call, case)
        expected = single(bugs.expected.CausalSelfAttention, sd, H, Hkv, x)
        for rank, (got, again) in enumerate(zip(*outs)):
            tensors = all(isinstance(t, torch.Tensor) for t in (got, again))
            if tensors and (got.shape, got.dtype) == (again.shape, again.dtype):
                moved = (got - again).abs().max().item() if got.numel() else 0.0
                expect.that(torch.allclose(got, again, equal_nan=True, **tol), f"Rank {rank}'s output changed when "
                            "only the weights it does not hold changed: it computes with weights outside its shards "
                            "(a copy of the full matrices, or another rank's heads), so the work is not divided.",
                            call=f"{call}: rank {rank}'s output", case=case,
                            got=f"outputs of the two modules apart by up to {moved:.3g}",
                            expected="the same output from both: the same shards on this rank, the same shares of "
                                     "the others")
            expect.array(got, expected, call=f"{call}: rank {rank}'s output", case=case, what=f"rank {rank}'s output",
                         against="the single-process CausalSelfAttention with the full weights", **tol)
    check_untampered(learner, call=call, case=case)


def test_one_all_reduce(learner, bugs, rng):
    """exactly one collective per forward on every rank: an all_reduce of the (B, T, d_model) output"""
    for world, (_, _, d, H, Hkv) in ((2, CONFIGS[2][1]), (4, CONFIGS[4][1])):
        # 8 x 32 tokens: the output's 98 kB fill the loopback's 64 kB packets, so the count of bytes is
        # the transfers' and not their packets' headers, whose number varies with the load
        B, T = 8, 32
        sd, x = full_weights(rng, d, H, Hkv), normal(rng, B, T, d)
        call = CALL.format(H=H, Hkv=Hkv, world=world)
        case = CASE.format(dtype="float64", B=B, T=T, d=d, H=H, Hkv=Hkv, world=world)
        hd, kv = d // H, max(Hkv // world, 1)
        qkv_widths = {(H + 2 * Hkv) * hd, (H // world + 2 * kv) * hd}   # the full and the rank's projection
        ranks = learner.ranks(world)
        mods = build(ranks, sd, H, Hkv, world)
        forward_all(ranks, mods, normal(rng, B, T, d), call=call, case=case)   # a first call: lazy set-up first
        entered = []   # each rank's collectives, for every measured forward
        sent = least_sent(ranks, lambda: entered.append(forward_all(ranks, mods, x, call=call, case=case)[1]))
        if sent is not None:
            # The bytes of one all-reduce of the output, sent by kit code in ranks that load no file of the
            # learner's: in its own ranks' processes, its code could make the kit's all-reduce send more.
            zeros, kit = torch.zeros(B, T, d, dtype=torch.float64), learner.kit_ranks(world)
            reduce = lambda: kit.each(lambda r, L: L.kit_function("all_reduce")(zeros))
            reduce()   # a first call: the group started, and gloo's lazy set-up done
            one = least_sent(kit, reduce)
        for rank, calls in (pair for of_ranks in entered for pair in enumerate(of_ranks)):
            after_qkv = any(name == "all_reduce" and shape and shape[-1] in qkv_widths for name, shape in calls)
            expect.that(calls == [("all_reduce", (B, T, d))], f"Rank {rank} does not communicate exactly once per "
                        "forward: the layer needs one all_reduce, of its share of the output (a barrier is a "
                        "collective too).", call=call, case=case,
                        got=", ".join(f"{n} of {list(s)}" if s else n for n, s in calls) or "no collective",
                        expected=f"all_reduce of [{B}, {T}, {d}], once",
                        diagnose=lambda: "all-reduce-after-qkv" if after_qkv else None)
        if sent is not None:
            expect.that(sent <= 1.5 * one, "The ranks sent more over their connection than one all-reduce of the "
                        "output needs: some communication is not the one recorded all_reduce.", call=call, case=case,
                        got=f"{sent:,} bytes sent in one forward", expected=f"about {one:,} bytes, what one all_reduce "
                        f"of a [{B}, {T}, {d}] float64 tensor sends")
    check_untampered(learner, call=call, case=case)
