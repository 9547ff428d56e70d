"""`kata plot`: every declared plot drawn from the reference through the installed `kata`
command, the data behind each figure checked against what the kata teaches, failures of the
learner's code reported without a file, and a learner's file at --out never replaced."""
import json
import math
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import cli
from graders.engine.learner import Learner
from graders.engine.manifest import ROOT, find, katas
from graders.engine.sandbox import Sandbox
from graders.practice import plots
from graders.practice.notebook import SOLUTION_TAG

# The commands run here fork from the session's zygotes; test_a_stub_writes_no_file runs `kata` as a process.
pytestmark = pytest.mark.usefixtures("warm_commands")

PLOTS = [(k.slug, kind) for k in katas() for kind in k.plots]
SMALL_T = 256   # the complexity plot's largest T in these tests: seconds, not tens of seconds


def reference_in(workspace, slug):
    kata = find(slug)
    shutil.copyfile(ROOT / "reference" / f"{kata.module}.py", workspace / kata.learner_file)
    return workspace / kata.learner_file


@pytest.fixture
def compute(tmp_path, zygotes):
    """``compute(slug, kind)``: the data of a plot drawn from the reference, in a sandbox forked
    from the session's zygote."""

    def run(slug, kind, **options):
        kata = find(slug)
        return plots.compute(kata, kind, reference_in(tmp_path, slug), seed=0, device="cpu",
                             zygote=zygotes(kata.framework), **options)
    return run


def test_every_declared_plot_has_a_drawing():
    assert PLOTS, "no kata declares a plot"
    assert set(PLOTS) == set(plots.PLOTS)


def real_png(out, image_of):
    """``out`` is a real drawing: a PNG of a figure's size with more than a few colours."""
    assert out.read_bytes().startswith(plots.PNG_MAGIC)
    image = image_of(out)
    height, width = image.shape[:2]
    assert 600 <= height <= 1200 and 1500 <= width <= 3000
    colours = np.unique((image[..., :3] * 255).round().reshape(-1, 3), axis=0)
    assert len(colours) > 50, "a blank or nearly blank image"


def test_kata_plot_replaces_an_older_plot_with_a_real_png(tmp_path):
    """The command's whole path, for one plot; every plot's drawing is the test below's."""
    import matplotlib.image   # here, not at collection: a third of a second
    slug, kind = "causal-mask", "heatmaps"
    reference_in(tmp_path, slug)
    out = tmp_path / f"{slug}-{kind}.png"
    matplotlib.image.imsave(out, np.zeros((2, 2, 3)))   # an older plot: a PNG, so it is replaced
    run = CliRunner().invoke(cli.main, ["plot", slug, "--kind", kind, "--device", "cpu", "-w", str(tmp_path)])
    assert run.exit_code == 0, run.output
    assert run.stdout.strip() == f"Wrote {out}"
    real_png(out, matplotlib.image.imread)
    assert [p.name for p in tmp_path.glob("*.png")] == [out.name], "a temporary file was left behind"


@pytest.mark.parametrize("slug,kind", PLOTS)
def test_the_reference_draws_a_real_png(compute, tmp_path, slug, kind):
    """What `kata plot` does (the test above) for every declared plot, from the session's zygote:
    the command's own path is the same for every plot, and a cold sandbox for each would cost
    seconds apiece."""
    import matplotlib.image
    out = tmp_path / f"{slug}-{kind}.png"
    plots.save(plots.draw(compute(slug, kind, max_t=SMALL_T)), out)
    real_png(out, matplotlib.image.imread)


def test_curves_show_that_only_sqrt_stays_flat(compute):
    data = compute("scaling-variance", "curves")
    d_k = np.array(data["d_k"], dtype=float)
    assert data["d_k"][0] == 1 and data["d_k"][-1] == 1024
    expected = {"none": np.sqrt(d_k), "sqrt": np.ones_like(d_k), "linear": 1 / np.sqrt(d_k)}
    for scale, std in expected.items():
        np.testing.assert_allclose(data["score_std"][scale], std, rtol=1e-12)
        # 4,000 samples: the sample std is within ~1.1 % of the true one (one standard error)
        np.testing.assert_allclose(data["sample_score_std"][scale], std, rtol=0.06)
    weights = {scale: np.array(w) for scale, w in data["mean_max_weight"].items()}
    assert weights["none"][-1] > 0.9 and np.all(np.diff(weights["none"]) > 0)
    assert abs(weights["linear"][-1] - 1 / data["n_keys"]) < 0.02
    assert np.ptp(weights["sqrt"][2:]) < 0.08   # flat from d_k = 4 on


def assert_causal_rows(weights, *, allowed_keys=None):
    T = weights.shape[-1]
    allowed = np.tril(np.ones((T, T), dtype=bool))
    if allowed_keys is not None:
        allowed[:, allowed_keys:] = False
    assert np.all(weights[~allowed] == 0), "weight on a key the masks forbid"
    assert np.all(weights[allowed] > 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_causal_heatmaps_are_lower_triangular_distributions(compute):
    data = compute("causal-mask", "heatmaps")
    assert data["tokens"] == plots.SENTENCE
    *heads, padded = data["panels"]
    assert len(heads) == 3
    for panel in heads:
        assert panel["weights"].shape == (10, 10)
        assert_causal_rows(panel["weights"])
    assert_causal_rows(padded["weights"], allowed_keys=plots.PADDED_LENGTH)
    assert not np.allclose(heads[0]["weights"], heads[1]["weights"]), "the heads should differ"


def test_mha_heatmaps_are_the_modules_causal_weights(compute):
    data = compute("mha", "heatmaps")
    assert len(data["panels"]) == 4
    for panel in data["panels"]:
        assert_causal_rows(panel["weights"])


def test_complexity_shows_quadratic_memory_against_sdpas_linear(compute):
    data = compute("mha", "complexity", max_t=512)
    assert data["T"] == [64, 128, 256, 512]
    mine, sdpa = np.array(data["learner"]["peak_bytes"]), np.array(data["sdpa"]["peak_bytes"])
    # The reference holds a few (1, H, T, T) float32 tensors at once: at least the scores.
    assert np.all(mine >= 4 * data["n_heads"] * np.array(data["T"]) ** 2)
    assert 3.3 < mine[-1] / mine[-2] <= 4.1
    assert 1.6 < sdpa[-1] / sdpa[-2] < 2.4
    assert all(s > 0 for s in data["learner"]["seconds"] + data["sdpa"]["seconds"])


def test_cross_heatmaps_hide_the_source_padding_and_draw_no_triangle(compute):
    data = compute("cross-attention", "heatmaps")
    assert data["tokens"] == plots.TARGET and data["key_tokens"][:len(plots.SOURCE)] == plots.SOURCE
    real = len(plots.SOURCE)
    for panel in data["panels"]:
        weights = panel["weights"]
        assert weights.shape == (len(plots.TARGET), real + plots.SOURCE_PADDING)
        assert np.all(weights[:, real:] == 0) and np.all(weights[:, :real] > 0)   # every real key, even "later" ones
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_encodings_show_the_table_and_an_offset_only_dot_product(compute):
    data = compute("positional-encoding", "encodings")
    T, d = data["T"], data["d"]
    table = data["table"]
    assert table.shape == (T, d) and np.abs(table).max() <= 1.0
    np.testing.assert_allclose(table[0], np.tile([0.0, 1.0], d // 2), atol=1e-7)   # sin 0, cos 0
    np.testing.assert_allclose(table[:, 0], np.sin(np.arange(T)), atol=1e-4)   # pair 0: wavelength 2π
    k = np.array(data["offsets"])
    assert k[0] == 0 and k[-1] == T // 2 and data["positions"] == T - T // 2
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    np.testing.assert_allclose(data["mean"], np.cos(np.outer(k, omega)).sum(-1), atol=1e-3)
    assert np.all(data["high"] - data["low"] < 1e-3), "the dot product should depend on the offset only"
    assert data["mean"][0] == pytest.approx(d / 2, abs=1e-4) and data["mean"].min() < d / 4


def test_rotation_shows_the_angles_and_a_score_that_depends_on_the_offset_only(compute):
    data = compute("rope", "rotation")
    T, hd = data["T"], data["hd"]
    cos = data["cos"]
    assert cos.shape == (T, hd // 2) and np.abs(cos).max() <= 1.0
    np.testing.assert_allclose(cos[0], 1.0)   # position 0 turns nothing
    np.testing.assert_allclose(cos[:, 0], np.cos(np.arange(T)), atol=1e-4)   # pair 0: θ_0 = 1
    dots = data["dots"]
    assert dots.shape == (len(data["starts"]), len(data["offsets"])) and data["starts"][0] == 0
    assert np.all(np.ptp(dots, axis=0) < 1e-3), "the score should depend on the offset only"
    assert np.ptp(dots[0]) > 0.5, "the score should change with the offset"


def test_band_shows_the_window_the_causal_mask_and_a_reach_growing_by_window_minus_one(compute):
    data = compute("sliding-window", "band")
    T, W, Tq = data["T"], data["window"], data["queries"]
    back = np.arange(T)[:, None] - np.arange(T)[None, :]   # (T, T): how far back key j lies from query i
    band, causal, chunk, reach = (np.asarray(panel["mask"]) for panel in data["panels"])
    np.testing.assert_array_equal(band, (back >= 0) & (back < W))
    np.testing.assert_array_equal(causal, back >= 0)
    np.testing.assert_array_equal(chunk, band[T - Tq:])   # the last Tq queries: bottom-right
    np.testing.assert_array_equal(reach, (back >= 0) & (back < data["layers"] * (W - 1) + 1))
    L = np.array(data["reach_layers"])
    assert data["reach"] == list(np.minimum(L * (W - 1) + 1, data["reach_T"]))
    assert data["reach"][-1] < data["reach_T"], "the curve should grow linearly to its last layer"


def test_flash_memory_grows_linearly_and_the_naive_quadratically(compute):
    data = compute("flash-tiling", "memory", max_t=512)
    assert data["T"] == [64, 128, 256, 512]
    tiled, naive = np.array(data["learner"]), np.array(data["naive"])
    T = np.array(data["T"])
    # The naive version holds at least the (1, H, T, T) float32 scores; the tiles stay one size and
    # only the (1, H, T, head_dim) output grows.
    assert np.all(naive >= 4 * data["n_heads"] * T**2)
    assert 3.3 < naive[-1] / naive[-2] <= 4.1
    assert 1.6 < tiled[-1] / tiled[-2] < 2.4
    assert tiled[-1] < naive[-1] / 3, "at T = 512 the tiles take a fraction of the whole score matrix"



def test_prefix_blocks_show_a_shared_prefix_and_a_freed_block_hit_again(compute):
    data = compute("prefix-cache", "blocks")
    rows = {r["id"]: r for r in data["requests"] if "id" in r}
    assert rows["r1"]["blocks"][:2] == rows["r0"]["blocks"][:2] and rows["r1"]["cached"] == 8
    # r0 is freed before r2 arrives: its four full blocks are hit all the same.
    assert rows["r2"]["blocks"][:4] == rows["r0"]["blocks"] and rows["r2"]["cached"] == 16
    assert [rows[r]["cached"] for r in ("r0", "r3", "r5", "r6")] == [0, 0, 12, 20]
def test_tree_shows_ancestors_only_positions_by_depth_and_a_causal_chain(compute):
    data = compute("spec-decode", "tree")
    parents, P = data["parents"], data["prefix"]
    n = len(parents)
    tree, chain = np.asarray(data["tree"]), np.asarray(data["chain"])
    assert tree.shape == chain.shape == (n, P + n) and tree[:, :P].all()
    np.testing.assert_array_equal(chain, np.tril(np.ones((n, P + n), dtype=bool), P))
    for i, parent in enumerate(parents):
        ancestors = {i}
        while parent != -1:
            ancestors.add(parent)
            parent = parents[parent]
        assert set(np.flatnonzero(tree[i, P:])) == ancestors, i
        assert data["positions"][i] == P + len(ancestors) - 1
    assert not tree[1, P], "two roots are siblings: neither sees the other"
def test_ring_shows_the_contiguous_imbalance_and_an_even_zigzag(compute):
    data = compute("ring-attention", "ring")
    W, T = data["world"], data["T_local"]
    assert data["zigzag"][0] == [*range(T // 2), *range(W * T - T // 2, W * T)]   # chunks 0 and 2W-1
    assert data["scores"]["contiguous"] == [(r + 1) * T * T for r in range(W)]   # rank r: r + 1 blocks
    assert data["scores"]["zig-zag"] == [T * T + (W - 1) * T * T // 2] * W   # the same on every rank


def test_a_stub_writes_no_file(kata_cmd):
    """End to end through the installed command."""
    assert kata_cmd("start", "causal-mask").returncode == 0
    run = kata_cmd("plot", "causal-mask", "--device", "cpu")
    assert run.returncode == 1
    assert "causal_mask is not implemented yet" in run.stderr and "kata check causal-mask" in run.stderr
    assert "Traceback" not in run.stderr
    assert list(kata_cmd.workspace.glob("*.png")) == []


def test_a_nan_is_reported_and_writes_no_file(tmp_path):
    source = (ROOT / "reference" / "scaling_variance.py").read_text()
    (tmp_path / "scaling_variance.py").write_text(source.replace("return float(np.sqrt(d_k) / _divisor(d_k, scale))",
                                                                 "return float('nan')"))
    result = CliRunner().invoke(cli.main, ["plot", "scaling-variance", "-w", str(tmp_path)])
    assert result.exit_code == 1
    assert "not finite" in result.output and "score_std(1, 'none')" in result.output
    assert list(tmp_path.glob("*.png")) == []


def test_a_file_that_is_not_a_png_is_left_alone(tmp_path):
    reference_in(tmp_path, "scaling-variance")
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"my notes, not an image\n")
    result = CliRunner().invoke(cli.main, ["plot", "scaling-variance", "-w", str(tmp_path), "--out", str(notes)])
    assert result.exit_code == 2
    assert "is not a PNG image" in result.output
    assert notes.read_bytes() == b"my notes, not an image\n"


def test_file_draws_from_a_scratch_file_or_a_notebooks_solution_cells(kata_cmd, tmp_path):
    reference = (ROOT / "reference" / "scaling_variance.py").read_text()
    scratch = tmp_path / "try 2.py"
    scratch.write_text(reference)
    run = kata_cmd("plot", "scaling-variance", "--file", str(scratch), "--out", str(tmp_path / "a.png"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    assert kata_cmd("notebook", "scaling-variance").returncode == 0
    notebook = kata_cmd.workspace / "scaling_variance.ipynb"
    nb = json.loads(notebook.read_text())
    solution = next(c for c in nb["cells"] if SOLUTION_TAG in c["metadata"].get("tags", []))
    solution["source"] = solution["source"].split("\n")[0] + "\n" + reference
    notebook.write_text(json.dumps(nb))
    run = kata_cmd("plot", "scaling-variance", "--file", str(notebook), "--out", str(tmp_path / "b.png"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "b.png").read_bytes().startswith(b"\x89PNG")
    assert not (kata_cmd.workspace / "scaling_variance.py").exists()   # nothing written beside the notebook
    run = kata_cmd("plot", "scaling-variance", "--file", str(scratch.with_name("none.py")))
    assert run.returncode == 2 and "does not exist" in run.stderr


def test_katas_and_kinds_without_a_plot_are_usage_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli.main, ["plot", "softmax", "-w", str(tmp_path)])
    assert result.exit_code == 2
    assert "softmax has no plots" in result.output and "causal-mask" in result.output
    result = runner.invoke(cli.main, ["plot", "mha", "--kind", "bars", "-w", str(tmp_path)])
    assert result.exit_code == 2
    assert "heatmaps, complexity" in result.output


def test_tensor_peak_bytes_counts_live_tensors_on_the_cpu(tmp_path, zygotes):
    n = 1 << 16
    path = tmp_path / "mod.py"
    path.write_text("import torch\n"
                    "def chain(n):\n"
                    "    x = torch.ones(n)\n"
                    "    for _ in range(10):\n"
                    "        x = x + 1   # the old x is freed once the new one exists\n"
                    "    return x\n")
    with Sandbox(path, zygote=zygotes("torch"), framework="torch", module_name="mod", timeout_s=10, import_timeout_s=10,
                 memory_mb=1024).start() as sandbox:
        learner = Learner(sandbox)
        assert learner.tensor_peak_bytes(learner.chain, n) == 2 * 4 * n   # two float32 vectors, never eleven
        sdpa = learner.kit_function("sdpa_self_attention")
        x, w, b = torch.randn(1, 5, 8), torch.randn(24, 8), torch.randn(24)
        got = sdpa(x, w, b, torch.eye(8), torch.zeros(8), 2, causal=True)
        q, k, v = (x @ w.T + b).split(8, dim=-1)
        heads = [t.view(1, 5, 2, 4).transpose(1, 2) for t in (q, k, v)]
        scores = (heads[0] @ heads[1].transpose(-2, -1) / math.sqrt(4)).masked_fill(~torch.ones(5, 5).tril().bool(),
                                                                                    float("-inf"))
        expected = (scores.softmax(-1) @ heads[2]).transpose(1, 2).reshape(1, 5, 8)
        torch.testing.assert_close(got, expected)
