"""Grader of the ring-attention kata (katas/ring-attention/README.md).

The learner's file runs as the ranks of one torch.distributed group inside its sandbox
(``learner.ranks(world)``); the reference and the bug oracles, trusted, run here as threads whose
sends and receives go through queues (``simulate``), so a wrong output can be named. What a rank
holds and sends is read from outside it: its peak memory as the kernel counts it, the bytes over
the group's own loopback, the collectives its process group records, the score products it ran.
"""
import math
import queue
import threading
import time
from unittest import mock

import torch
import torch.distributed as dist

from graders.engine import expect
from graders.engine.learner import least_sent
from graders.engine.products import score_tiles
from graders.engine.recording import recorded
from graders.engine.structure import check_untampered
from graders.engine.weights import normal

# (B, H, T_local, head_dim) per world size: T_local even (the zig-zag halves), head_dim differs
# from T_local and its half, so that a block of scores is told from a product with v.
SHAPES = {2: (2, 3, 6, 5), 4: (2, 3, 6, 5)}
# Memory and traffic: one (1, 2, 64, 1024) float64 tensor is 1 MiB, a chunk of k and v 2 MiB, the
# scores of a block 64 KiB: the chunks of keys and values are what a rank's memory holds.
BIG = (1, 2, 64, 1024)
CALL = "ring_attention(q, k, v, causal={causal}, rank, {world}, zigzag={zigzag}) on each of the {world} ranks"
CASE = ("q, k, v: {dtype} ({B}, {H}, {T}, {d}) on each rank, its chunk of a ({B}, {H}, {full}, {d}) sequence "
        "drawn standard normal ({layout})")


def layout(zigzag: bool) -> str:
    if zigzag:
        return "zig-zag: rank r holds chunks r and 2·world-1-r of 2·world"
    return "contiguous: rank r holds chunk r"


@recorded
def simulate(ring, qs, ks, vs, causal, world, zigzag):
    """A trusted ring_attention (the reference's or a bug's) run here, each rank a thread whose
    point-to-point sends go through queues and whose all_gather meets at a barrier: every rank's
    (out, lse). A rank that raises stops the others, and its error is raised."""
    boxes = {(a, b): queue.Queue() for a in range(world) for b in range(world)}   # (from, to)
    barrier, local, stopped = threading.Barrier(world, timeout=30), threading.local(), threading.Event()
    slots, results, errors = [None] * world, [None] * world, []

    def take(src):
        deadline = time.monotonic() + 30
        while not stopped.is_set() and time.monotonic() < deadline:
            try:
                return boxes[src, local.rank].get(timeout=0.05)
            except queue.Empty:
                continue
        raise RuntimeError("a rank waited for a chunk that never came")

    class Work:
        def __init__(self, finish=None):
            self.finish = finish

        def wait(self, timeout=None):
            if self.finish is not None:
                self.finish()
                self.finish = None
            return True

    def isend(tensor, dst, group=None, tag=0):
        boxes[local.rank, dst].put(tensor.clone())
        return Work()

    def irecv(tensor, src, group=None, tag=0):
        return Work(lambda: tensor.copy_(take(src)))

    def recv(tensor, src, group=None, tag=0):
        irecv(tensor, src).wait()
        return src

    class P2POp:
        def __init__(self, op, tensor, peer=None, group=None, tag=0):
            self.op, self.tensor, self.peer = op, tensor, peer

    def all_gather(tensors, tensor, group=None, async_op=False):
        slots[local.rank] = tensor.clone()
        barrier.wait()
        for out, got in zip(tensors, slots):
            out.copy_(got)
        barrier.wait()   # every rank has read every slot before any writes again
        return Work() if async_op else None

    def run(rank):
        local.rank = rank
        try:
            with torch.no_grad():
                results[rank] = tuple(ring(qs[rank].clone(), ks[rank].clone(), vs[rank].clone(), causal, rank, world,
                                           zigzag))
        except Exception as exc:   # noqa: BLE001  a bug may raise: the others must not wait for it
            errors.append(exc)
            stopped.set()
            barrier.abort()

    with mock.patch.multiple(dist, isend=isend, irecv=irecv, send=lambda t, dst, group=None, tag=0: isend(t, dst),
                             recv=recv, P2POp=P2POp, all_gather=all_gather,
                             batch_isend_irecv=lambda ops: [o.op(o.tensor, o.peer) for o in ops],
                             get_rank=lambda group=None: local.rank, get_world_size=lambda group=None: world):
        threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return tuple(results)


def sequence(rng, shape, world, dtype=torch.float64, scale=1.0):
    """A whole sequence's q, k, v (B, H, world * T_local, head_dim), standard normal times ``scale``."""
    B, H, T, d = shape
    return tuple((normal(rng, B, H, world * T, d) * scale).to(dtype) for _ in range(3))


def shard(bugs, x, world, zigzag):
    """Every rank's chunk of x along the positions, in the kata's layout."""
    if zigzag:
        return [bugs.reference.zigzag_shard(x, rank, world, 2) for rank in range(world)]
    return list(x.chunk(world, dim=2))


class Ring:
    """One call of every rank's ring_attention on its chunk of a drawn sequence, and what it must give."""

    def __init__(self, bugs, kata, rng, world, shape, causal, zigzag, dtype=torch.float64, scale=1.0):
        self.bugs, self.kata, self.world, self.causal, self.zigzag = bugs, kata, world, causal, zigzag
        q, k, v = sequence(rng, shape, world, dtype, scale)
        self.qs, self.ks, self.vs = (shard(bugs, x, world, zigzag) for x in (q, k, v))
        out, lse = bugs.expected.attention(q, k, v, causal)
        self.outs, self.lses = shard(bugs, out, world, zigzag), shard(bugs, lse, world, zigzag)
        B, H, T, d = shape
        self.call = CALL.format(causal=causal, world=world, zigzag=zigzag)
        self.case = CASE.format(dtype=str(dtype).removeprefix("torch."), B=B, H=H, T=T, d=d, full=world * T,
                                layout=layout(zigzag)) + (f", times {scale:g}" if scale != 1.0 else "")
        self.dtype, self.kv_bytes = dtype, 2 * self.ks[0].numel() * self.ks[0].element_size()

    def args(self, rank):
        return self.qs[rank], self.ks[rank], self.vs[rank], self.causal, rank, self.world, self.zigzag

    def run(self, ranks):
        return ranks.each(lambda r, L: L.ring_attention(*self.args(r)))

    def judge(self, got):
        """Every rank's (out, lse) equals the single-process attention's rows of its chunk."""
        tol, lse_tol = self.kata.tolerance(str(self.dtype).removeprefix("torch.")), self.kata.tolerance("float32")
        pairs = tuple(tuple(p) if isinstance(p, (tuple, list)) else p for p in got)
        diagnose = lambda: self.bugs.match(pairs, lambda impl: simulate(
            impl.ring_attention, self.qs, self.ks, self.vs, self.causal, self.world, self.zigzag), **lse_tol)
        for rank, pair in enumerate(got):
            call = f"{self.call}: rank {rank}'s result"
            expect.that(isinstance(pair, (tuple, list)) and len(pair) == 2, "ring_attention must return a pair "
                        "(out, lse).", call=call, case=self.case, got=type(pair).__name__,
                        expected="a tuple of two tensors", diagnose=diagnose)
            out, lse = pair
            expect.array(out, self.outs[rank], call=call, case=self.case, what=f"rank {rank}'s out", diagnose=diagnose,
                         against="the single-process attention of the whole sequence, this rank's rows",
                         axes=("batch", "head", "position", "channel"), **tol)
            expect.array(lse, self.lses[rank], call=call, case=self.case, what=f"rank {rank}'s lse", diagnose=diagnose,
                         against="the log-sum-exp of the whole sequence's scores, this rank's rows",
                         axes=("batch", "head", "position"), **lse_tol)


def gathered(ranks, before) -> bool:
    """Whether a rank entered a collective that gathers (or broadcasts) chunks since ``before``."""
    after = ranks.collectives([b["entered"][-1][0] if b["entered"] else -1 for b in before])
    return any("gather" in name or "broadcast" in name for a in after for _, name, _ in a["entered"])


def test_zigzag_shard_exact(learner, bugs, rng):
    """zigzag_shard keeps chunks r and 2·world-1-r, and zigzag_unshard puts every rank's shard back, exactly"""
    for world, shape, dim in ((2, (2, 3, 8, 5), 2), (4, (3, 16, 2), 1), (4, (2, 24), -1)):
        x = normal(rng, *shape)
        case = f"x: float64 {shape}, cut along dim={dim} into {2 * world} chunks of {shape[dim] // (2 * world)}"
        shards = []
        for rank in range(world):
            call = f"zigzag_shard(x, {rank}, {world}, {dim})"
            got = learner.zigzag_shard(x, rank, world, dim)
            shards.append(bugs.reference.zigzag_shard(x, rank, world, dim))
            expect.array(got, shards[-1], call=call, case=case, rtol=0, atol=0,
                         against=f"chunks {rank} and {2 * world - 1 - rank} of x, concatenated",
                         diagnose=lambda: bugs.match(got, lambda impl: impl.zigzag_shard(x, rank, world, dim),
                                                     rtol=0, atol=0))
        call = f"zigzag_unshard([shard of rank 0, ..., shard of rank {world - 1}], {world}, {dim})"
        got = learner.zigzag_unshard(shards, world, dim)
        expect.array(got, x, call=call, case=case + "; the shards zigzag_shard gives", rtol=0, atol=0,
                     against="x, the full sequence",
                     diagnose=lambda: bugs.match(got, lambda impl: impl.zigzag_unshard(shards, world, dim),
                                                 rtol=0, atol=0))


def test_matches_single_process(learner, bugs, kata, rng):
    """every rank's (out, lse) equals the single-process attention's rows at 2 and 4 ranks: non-causal, causal, causal zig-zag"""
    for world, shape in SHAPES.items():
        ranks = learner.ranks(world)
        for causal, zigzag in ((False, False), (True, False), (True, True)):
            ring = Ring(bugs, kata, rng, world, shape, causal, zigzag)
            ring.judge(ring.run(ranks))


def test_holds_two_chunks(learner, bugs, kata, rng):
    """a rank's peak memory does not grow with the number of ranks: it holds two chunks of k and v, never all of them"""
    peaks, rings, caught = {}, {}, False
    for world in (2, 4):
        ranks, ring = learner.ranks(world), Ring(bugs, kata, rng, world, BIG, False, False)
        before = ranks.collectives()
        ring.judge(ring.run(ranks))   # a first call: its values judged, its code paged in
        caught |= gathered(ranks, before)
        # Noise only adds pages (a thread's first malloc arena, pages the allocator keeps), about
        # half a chunk at times: the least of two calls is the call's own, a bug's growth in both.
        twice = [ranks.each(lambda r, L: L.peak_bytes(L.ring_attention, *ring.args(r))) for _ in range(2)]
        peaks[world] = [None if None in pair else min(pair) for pair in zip(*twice)]
        rings[world] = ring
    ring = rings[4]
    case = ring.case + f"; the same chunk sizes at 2 ranks; a chunk of k and v is {ring.kv_bytes:,} bytes"
    if None not in peaks[2] + peaks[4]:
        grown = max(peaks[4]) - max(peaks[2])
        # A ring holds the chunk in hand and the one arriving: at 2 ranks the one in hand is the
        # rank's own (its input), from 3 ranks on a received one, one chunk more; then no more,
        # whatever the ranks. An all_gather holds 4 chunks at 4 ranks, 2 at 2: two more. Between
        # them, the rest: a k or a v whose send is still pending, pages the allocator keeps (the
        # reference measured 0.9 to 1.5 chunks more on a loaded machine, gathering bugs 2.1 and 4.1).
        limit = 7 * ring.kv_bytes // 4
        expect.that(grown <= limit, "A rank's peak memory grows with the number of ranks: it holds more than the "
                    "chunk in hand and the one arriving (every rank's keys and values, gathered or kept).",
                    call="peak memory of each rank's call, as the kernel counts it, at 2 then 4 ranks",
                    case=case, got=f"{max(peaks[2]):,} bytes at 2 ranks, {max(peaks[4]):,} at 4: "
                                   f"{grown / ring.kv_bytes:.1f} chunks of k and v more",
                    expected=f"at most {limit:,} bytes more at 4 ranks (the chunk received before the one arriving, "
                             "and three quarters of a chunk for the rest)",
                    diagnose=lambda: "gathers-all-kv")
    expect.that(not caught, "A rank gathers every rank's keys and values with a collective: each rank then holds "
                "world_size chunks, the memory the ring exists to save.", call=ring.call, case=case,
                got="a gather among the collectives the ranks' process groups recorded",
                expected="point-to-point sends and receives only", diagnose=lambda: "gathers-all-kv")
    check_untampered(learner, call=ring.call, case=case)


def test_ring_traffic(learner, bugs, kata, rng):
    """each rank sends its neighbour world_size - 1 chunks of k and v per call, no more"""
    world = 4   # a transfer too many (world_size per rank) sends a third more here
    ranks, ring = learner.ranks(world), Ring(bugs, kata, rng, world, BIG, False, False)
    before = ranks.collectives()
    ring.judge(ring.run(ranks))
    sent = least_sent(ranks, lambda: ring.run(ranks), times=2)   # a ring's calls cost: two are enough here
    if sent is not None:
        ideal = world * (world - 1) * ring.kv_bytes
        limit = ideal + ideal // 20 + (64 << 10)   # 5 % and 64 KiB for the headers of packets and messages
        expect.that(sent <= limit, "The ranks send more than the ring needs: each rank passes on world_size - 1 "
                    "chunks of k and v (it never needs to send the last one it holds back to where it came "
                    "from), and nothing else.", call=ring.call,
                    case=ring.case + f"; a chunk of k and v is {ring.kv_bytes:,} bytes",
                    got=f"{sent:,} bytes over the loopback in one call ({sent / ring.kv_bytes / world:.2f} chunks "
                        "per rank)",
                    expected=f"about {ideal:,} bytes: {world} ranks × {world - 1} chunks",
                    diagnose=lambda: "gathers-all-kv" if gathered(ranks, before) else None)
    check_untampered(learner, call=ring.call, case=ring.case)


def computed(ops, shape) -> int:
    """Scores a rank's recorded products computed, per batch and head: the sizes of its blocks."""
    B, H, _, d = shape
    return sum(math.prod(tile) for tile in score_tiles(ops, d)) // (B * H)


def test_causal_blocks_skipped(learner, bugs, kata, rng):
    """under the causal mask no block above the diagonal is computed: rank r scores r+1 blocks contiguous, every rank the same zig-zag"""
    world, shape = 4, SHAPES[4]
    T = shape[2]
    ranks = learner.ranks(world)
    for zigzag in (False, True):
        ring = Ring(bugs, kata, rng, world, shape, True, zigzag)
        before = ranks.collectives()

        def run(rank, L):
            with L.recording() as ops:
                got = L.ring_attention(*ring.args(rank))
            return got, ops

        done = ranks.each(run)
        ring.judge([got for got, _ in done])
        caught = gathered(ranks, before)
        for rank, (_, ops) in enumerate(done):
            # contiguous: its own block and the r earlier ones; zig-zag: its own two chunks, then one
            # half of every other rank's (T/2 queries against T keys, or T queries against T/2)
            most = T * T + (world - 1) * T * T // 2 if zigzag else (rank + 1) * T * T
            count = computed(ops, shape)
            expect.that(count <= most, f"Rank {rank} computes scores the causal mask throws away: blocks of keys "
                        "that all come after its queries.", call=ring.call + " (its score products recorded)",
                        case=ring.case, got=f"{count:,} scores per batch and head ({count / (T * T):g} blocks of "
                                            f"{T}×{T})",
                        expected=f"at most {most:,} ({most / (T * T):g} blocks)",
                        diagnose=lambda: "gathers-all-kv" if caught else "computes-masked-blocks")
    check_untampered(learner, call=ring.call, case=ring.case)
