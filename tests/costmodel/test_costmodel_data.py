"""Cost model: reductions, softmax, normalization, pooling, gathers/scatters, copies, factories, views,
composites, losses and optimizer kernels, against hand-computed numbers. OpCalls are laid out as
torch.profiler records them (CPU traces, torch 2.13; GPU traces in tests/fixtures/traces)."""

from __future__ import annotations

import pytest

from opscope.costmodel import Cost, OpCall, estimate

F32, BF16, I64 = "float", "c10::BFloat16", "long int"


def cost(name, dims, dtypes, strides, concrete, list_dtype="") -> Cost:
    c = estimate(OpCall(name, tuple(dims), tuple(dtypes), tuple(strides), tuple(concrete), list_dtype))
    assert c is not None, name
    return c


# --- reductions --------------------------------------------------------------------------------------------

X = [4, 6, 5]
XS = [30, 5, 1]


def test_sum_full_and_along_dims():
    full = cost("aten::sum", [X, []], [F32, ""], [XS, []], ["", ""])  # sum(self, dtype)
    assert (full.flops, full.bytes, full.family) == (4 * 6 * 5, 4 * 6 * 5 * 4 + 4, "reduction")
    dim = cost("aten::sum", [X, [], [], []], [F32, "ScalarList", "Scalar", ""], [XS, [], [], []],
               ["", "[1]", "False", ""])
    assert (dim.flops, dim.bytes) == (4 * 6 * 5, 4 * 6 * 5 * 4 + 4 * 5 * 4)
    keep = cost("aten::sum", [X, [], [], []], [F32, "ScalarList", "Scalar", ""], [XS, [], [], []],
                ["", "[0, 2]", "True", ""])
    assert keep.bytes == 4 * 6 * 5 * 4 + 6 * 4
    # bias gradient: sum over dim 0 of a [32, 16] grad; dtype=7 (float64) output
    dbl = cost("aten::sum", [X, []], [F32, "Scalar"], [XS, []], ["", "7"])
    assert dbl.bytes == 4 * 6 * 5 * 4 + 8
    # out= variant from mean's CPU child: sum.IntList_out(self, dim, keepdim, dtype, out)
    out = cost("aten::sum", [X, [], [], [], [4, 6, 1]], [F32, "ScalarList", "Scalar", "Scalar", F32],
               [XS, [], [], [], [6, 1, 1]], ["", "[-1]", "True", "6", ""])
    assert out.bytes == 4 * 6 * 5 * 4 + 4 * 6 * 4
    ints = cost("aten::sum", [[4, 6], []], [I64, ""], [[6, 1], []], ["", ""])
    assert ints.bytes == 4 * 6 * 8 + 8


def test_mean_max_argmax_var_norm():
    m = cost("aten::mean", [X, [], [], []], [F32, "ScalarList", "Scalar", ""], [XS, [], [], []], ["", "[-1]", "True", ""])
    assert (m.flops, m.bytes) == (4 * 6 * 5 + 4 * 6, 4 * 6 * 5 * 4 + 4 * 6 * 4)
    mx = cost("aten::max", [X, [], []], [F32, "Scalar", "Scalar"], [XS, [], []], ["", "1", "False"])
    assert (mx.flops, mx.bytes) == (4 * 6 * 5, 4 * 6 * 5 * 4 + 4 * 5 * 4 + 4 * 5 * 8)  # values + int64 indices
    mx_all = cost("aten::max", [X], [F32], [XS], [""])
    assert mx_all.bytes == 4 * 6 * 5 * 4 + 4
    am = cost("aten::argmax", [X, [], []], [F32, "Scalar", "Scalar"], [XS, [], []], ["", "-1", "False"])
    assert am.bytes == 4 * 6 * 5 * 4 + 4 * 6 * 8
    am_all = cost("aten::argmax", [X, [], []], [F32, "", "Scalar"], [XS, [], []], ["", "", "False"])
    assert am_all.bytes == 4 * 6 * 5 * 4 + 8
    v = cost("aten::var", [X, [], [], []], [F32, "ScalarList", "Scalar", "Scalar"], [XS, [], [], []],
             ["", "[-1]", "1", "False"])
    assert (v.flops, v.bytes) == (4 * 4 * 6 * 5 + 4 * 6, 4 * 6 * 5 * 4 + 4 * 6 * 4)
    vm = cost("aten::var_mean", [X, [], [], []], [F32, "ScalarList", "Scalar", "Scalar"], [XS, [], [], []],
              ["", "[-1]", "1", "False"])
    assert (vm.flops, vm.bytes) == (4 * 4 * 6 * 5 + 2 * 4 * 6, 4 * 6 * 5 * 4 + 2 * 4 * 6 * 4)
    n = cost("aten::linalg_vector_norm", [X, [], [], [], []], [F32, "Scalar", "ScalarList", "Scalar", ""],
             [XS, [], [], [], []], ["", "2", "[-1]", "False", ""])
    assert (n.flops, n.bytes) == (2 * 4 * 6 * 5 + 4 * 6, 4 * 6 * 5 * 4 + 4 * 6 * 4)
    n1 = cost("aten::linalg_vector_norm", [X, [], [], [], []], [F32, "Scalar", "ScalarList", "Scalar", ""],
              [XS, [], [], [], []], ["", "1", "[-1]", "False", ""])
    assert n1.flops == 2 * 4 * 6 * 5


def test_logsumexp_cumsum_prod_all_any():
    c = cost("aten::logsumexp", [X, [], []], [F32, "ScalarList", "Scalar"], [XS, [], []], ["", "[-1]", "False"])
    assert (c.flops, c.bytes) == (4 * 4 * 6 * 5 + 2 * 4 * 6, 4 * 6 * 5 * 4 + 4 * 6 * 4)
    c = cost("aten::cumsum", [X, [], []], [F32, "Scalar", ""], [XS, [], []], ["", "1", ""])
    assert (c.flops, c.bytes) == (4 * 6 * 5, 2 * 4 * 6 * 5 * 4)
    c = cost("aten::prod", [X, [], [], []], [F32, "Scalar", "Scalar", ""], [XS, [], [], []], ["", "-1", "False", ""])
    assert (c.flops, c.bytes) == (4 * 6 * 5, 4 * 6 * 5 * 4 + 4 * 6 * 4)
    c = cost("aten::all", [[1, 141]], ["bool"], [[141, 1]], [""])  # GPU trace (attention-mask check)
    assert (c.flops, c.bytes) == (141, 141 + 1)
    c = cost("aten::any", [X, [], []], ["bool", "Scalar", "Scalar"], [XS, [], []], ["", "-1", "False"])
    assert c.bytes == 4 * 6 * 5 + 4 * 6


# --- softmax, normalization -----------------------------------------------------------------------------


def test_softmax_and_backward():
    c = cost("aten::_softmax", [X, [], []], [F32, "Scalar", "Scalar"], [XS, [], []], ["", "-1", "False"])
    assert (c.flops, c.bytes, c.family) == (5 * 4 * 6 * 5, 2 * 4 * 6 * 5 * 4, "softmax")
    half_to_float = cost("aten::_softmax", [X, [], []], [BF16, "Scalar", "Scalar"], [XS, [], []], ["", "-1", "True"])
    assert half_to_float.bytes == 4 * 6 * 5 * 2 + 4 * 6 * 5 * 4
    b = cost("aten::_log_softmax_backward_data", [[4, 5], [4, 5], [], []], [F32, F32, "Scalar", "Scalar"],
             [[5, 1], [5, 1], [], []], ["", "", "1", "6"])
    assert (b.flops, b.bytes) == (4 * 4 * 5, 3 * 4 * 5 * 4)
    assert cost("aten::softmax", [X, [], []], [F32, "Scalar", ""], [XS, [], []], ["", "-1", ""]).family == "composite"


def test_layer_norm_from_gpu_trace():
    c = cost("aten::native_layer_norm", [[1, 141, 512], [], [512], [512], []],
             [BF16, "ScalarList", BF16, BF16, "Scalar"], [[72192, 512, 1], [], [1], [1], []],
             ["", "[512]", "", "", "9.9999999999999998e-13"])
    assert c.flops == 8 * 141 * 512
    # in + weight + bias + out (bf16) + mean and rstd per row (float32)
    assert c.bytes == 141 * 512 * 2 + 512 * 2 * 2 + 141 * 512 * 2 + 2 * 141 * 4
    assert c.family == "norm"
    no_affine = cost("aten::native_layer_norm", [[2, 4, 6], [], [], [], []], [F32, "ScalarList", "", "", "Scalar"],
                     [[24, 6, 1], [], [], [], []], ["", "[4, 6]", "", "", "1e-05"])
    assert (no_affine.flops, no_affine.bytes) == (6 * 48, 48 * 4 * 2 + 2 * 2 * 4)


def test_layer_norm_backward_mask():
    dims = [[2, 4, 6], [2, 4, 6], [], [2, 4, 1], [2, 4, 1], [6], [6], []]
    types = [F32, F32, "ScalarList", F32, F32, F32, F32, "ScalarList"]
    strides = [[24, 6, 1], [24, 6, 1], [], [4, 1, 1], [4, 1, 1], [1], [1], []]
    c = cost("aten::native_layer_norm_backward", dims, types, strides, ["", "", "[6]", "", "", "", "", "[True, True, True]"])
    assert c.flops == (10 + 2 + 1) * 48
    assert c.bytes == (48 + 48 + 8 + 8 + 6) * 4 + (48 + 6 + 6) * 4
    only_dx = cost("aten::native_layer_norm_backward", dims, types, strides,
                   ["", "", "[6]", "", "", "", "", "[True, False, False]"])
    assert only_dx.flops == 10 * 48


def test_batch_norm_train_eval_and_group_rms():
    args = ([[2, 4, 6, 6], [4], [4], [4], [4], [], [], []], [F32, F32, F32, F32, F32, "Scalar", "Scalar", "Scalar"],
            [[144, 36, 6, 1], [1], [1], [1], [1], [], [], []])
    train = cost("aten::native_batch_norm", *args, ["", "", "", "", "", "True", "0.1", "1e-05"])
    n = 2 * 4 * 6 * 6
    assert train.flops == 8 * n
    # x, w, b, running stats read + updated, out, save_mean/save_invstd
    assert train.bytes == (n + 4 + 4) * 4 + 2 * (4 + 4) * 4 + n * 4 + 2 * 4 * 4
    ev = cost("aten::native_batch_norm", *args, ["", "", "", "", "", "False", "0.1", "1e-05"])
    assert (ev.flops, ev.bytes) == (4 * n, (n + 4 * 4) * 4 + n * 4)
    gn = cost("aten::native_group_norm", [[2, 4, 6, 6], [4], [4], [], [], [], [], []],
              [F32, F32, F32, "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"], [[144, 36, 6, 1], [1], [1], [], [], [],
                                                                             [], []],
              ["", "", "", "2", "4", "36", "2", "1e-05"])
    assert (gn.flops, gn.bytes) == (8 * n, (n + 8) * 4 + n * 4 + 2 * 2 * 2 * 4)
    rms = cost("aten::_fused_rms_norm", [[2, 4, 6], [], [6], []], [F32, "ScalarList", F32, ""], [[24, 6, 1], [], [1], []],
               ["", "[6]", "", ""])
    assert (rms.flops, rms.bytes) == (4 * 48, (48 + 6) * 4 + 48 * 4 + 8 * 4)


@pytest.mark.parametrize("name", ["aten::layer_norm", "aten::batch_norm", "aten::group_norm", "aten::instance_norm",
                                  "aten::rms_norm", "aten::_batch_norm_impl_index"])
def test_norm_composites(name):
    c = cost(name, [[1, 141, 512], [], [512], [512], [], []], [BF16, "ScalarList", BF16, BF16, "Scalar", "Scalar"],
             [[72192, 512, 1], [], [1], [1], [], []], ["", "[512]", "", "", "1e-12", "True"])
    assert (c.flops, c.bytes, c.family) == (0, 0, "composite")


# --- pooling ------------------------------------------------------------------------------------------------


def test_max_pool_with_indices_and_ceil_mode():
    # max_pool2d(x [2,4,9,9], 3, 2, 1) -> out [2,4,5,5] + int64 indices
    c = cost("aten::max_pool2d_with_indices", [[2, 4, 9, 9], [], [], [], [], []],
             [F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[324, 81, 9, 1], [], [], [], [], []], ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False"])
    out = 2 * 4 * 5 * 5
    assert (c.flops, c.bytes, c.family) == (out * 3 * 3, 2 * 4 * 81 * 4 + out * (4 + 8), "pool")
    # dilation 2, ceil_mode: (9 + 2 - 2*2 - 1) / 2 -> ceil 3, + 1 = 4
    c = cost("aten::max_pool2d_with_indices", [[2, 4, 9, 9], [], [], [], [], []],
             [F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
             [[324, 81, 9, 1], [], [], [], [], []], ["", "[3, 3]", "[2, 2]", "[1, 1]", "[2, 2]", "True"])
    assert c.flops == 2 * 4 * 4 * 4 * 3 * 3
    # max_pool1d without indices; empty stride means stride = kernel
    c = cost("aten::max_pool1d", [[2, 4, 9], [], [], [], [], []],
             [F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"], [[36, 9, 1], [], [], [], [], []],
             ["", "[2]", "[]", "[0]", "[1]", "False"])
    assert (c.flops, c.bytes) == (2 * 4 * 4 * 2, 2 * 4 * 9 * 4 + 2 * 4 * 4 * 4)


def test_avg_and_adaptive_pooling_and_backward():
    c = cost("aten::avg_pool2d", [[2, 4, 9, 9], [], [], [], [], [], []],
             [F32, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", ""],
             [[324, 81, 9, 1], [], [], [], [], [], []], ["", "[3, 3]", "[2, 2]", "[1, 1]", "False", "True", ""])
    out = 2 * 4 * 5 * 5
    assert (c.flops, c.bytes) == (out * (9 + 1), 2 * 4 * 81 * 4 + out * 4)
    # adaptive 9 -> 3: windows of exactly 3 along each dim
    c = cost("aten::_adaptive_avg_pool2d", [[2, 4, 9, 9], []], [F32, "ScalarList"], [[324, 81, 9, 1], []], ["", "[3, 3]"])
    assert (c.flops, c.bytes) == (2 * 4 * 81 + 2 * 4 * 9, 2 * 4 * 81 * 4 + 2 * 4 * 9 * 4)
    # adaptive 5 -> 3: windows [0,2) [1,4) [3,5) -> 2 + 3 + 2 = 7 per dim
    c = cost("aten::_adaptive_avg_pool2d", [[1, 1, 5, 5], []], [F32, "ScalarList"], [[25, 25, 5, 1], []], ["", "[3, 3]"])
    assert c.flops == 7 * 7 + 9
    b = cost("aten::max_pool2d_with_indices_backward", [[2, 4, 5, 5], [2, 4, 9, 9], [], [], [], [], [], [2, 4, 5, 5]],
             [F32, F32, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", I64],
             [[0, 0, 0, 0], [324, 81, 9, 1], [], [], [], [], [], [100, 25, 5, 1]],
             ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False", ""])
    assert (b.flops, b.bytes) == (out, 4 + out * 8 + 2 * 4 * 81 * 4)
    for name in ("aten::max_pool2d", "aten::adaptive_avg_pool2d", "aten::avg_pool1d"):
        assert cost(name, [[2, 4, 9, 9], []], [F32, "ScalarList"], [[324, 81, 9, 1], []], ["", "[1, 1]"]).family == "composite"


# --- gather / scatter / embedding -------------------------------------------------------------------------


def test_embedding_reads_only_gathered_rows():
    # BERT word embeddings (GPU trace): index_select(table [30522, 512] bf16, 0, ids [141])
    c = cost("aten::index_select", [[30522, 512], [], [141]], [BF16, "Scalar", I64], [[512, 1], [], [1]], ["", "0", ""])
    assert c.flops == 0 and c.family == "gather"
    assert c.bytes == 141 * 8 + 141 * 512 * 2 + 141 * 512 * 2  # ids + rows read + rows written
    assert c.bytes < 30522 * 512 * 2 / 100
    e = cost("aten::embedding", [[30522, 512], [1, 141], [], [], []], [BF16, I64, "Scalar", "Scalar", "Scalar"],
             [[512, 1], [141, 1], [], [], []], ["", "", "0", "False", "False"])
    assert (e.flops, e.bytes, e.family) == (0, 0, "composite")


def test_gather_scatter_index_add():
    g = cost("aten::gather", [[4, 6], [], [4, 2], []], [F32, "Scalar", I64, "Scalar"], [[6, 1], [], [2, 1], []],
             ["", "1", "", "False"])
    assert (g.flops, g.bytes) == (0, 4 * 2 * 8 + 2 * 4 * 2 * 4)
    s = cost("aten::scatter", [[4, 6], [], [4, 2], [4, 2]], [F32, "Scalar", I64, F32], [[6, 1], [], [2, 1], [2, 1]],
             ["", "1", "", ""])
    assert (s.flops, s.bytes, s.family) == (0, 4 * 2 * 8 + 4 * 2 * 4 + 4 * 2 * 4, "scatter")
    sa = cost("aten::scatter_add_", [[4, 6], [], [4, 2], [4, 2]], [F32, "Scalar", I64, F32], [[6, 1], [], [2, 1], [2, 1]],
              ["", "1", "", ""])
    assert (sa.flops, sa.bytes) == (4 * 2, 4 * 2 * 8 + 4 * 2 * 4 + 2 * 4 * 2 * 4)
    ia = cost("aten::index_add_", [[4, 6], [], [2], [2, 6], []], [F32, "Scalar", I64, F32, "Scalar"],
              [[6, 1], [], [1], [6, 1], []], ["", "0", "", "", "1"])
    assert (ia.flops, ia.bytes) == (2 * 6, 2 * 8 + 2 * 6 * 4 + 2 * 2 * 6 * 4)


def test_embedding_dense_backward_and_index_put():
    c = cost("aten::embedding_dense_backward", [[4, 8, 16], [4, 8], [], [], []], [F32, I64, "Scalar", "Scalar", "Scalar"],
             [[128, 16, 1], [8, 1], [], [], []], ["", "", "1000", "-1", "False"])
    # grad rows + indices read, 32 rows read-modify-written (the 1000-row zero-fill is a child zero_)
    assert (c.flops, c.bytes) == (4 * 8 * 16, 4 * 8 * 16 * 4 + 4 * 8 * 8 + 2 * 4 * 8 * 16 * 4)
    # index_put_(self, indices (not recorded), values [2, 6], accumulate) -> _index_put_impl_
    p = cost("aten::_index_put_impl_", [[4, 6], [], [2, 6], [], []], [F32, "", F32, "Scalar", "Scalar"],
             [[6, 1], [], [6, 1], [], []], ["", "", "", "False", "False"])
    assert (p.flops, p.bytes) == (0, 2 * 6 * 4 * 2)
    assert cost("aten::index_put_", [[4, 6], [], [2, 6], []], [F32, "", F32, "Scalar"], [[6, 1], [], [6, 1], []],
                ["", "", "", "False"]).family == "composite"


def test_index_with_unrecorded_indices_is_unknown():
    # x[idx]: the profiler records the Tensor?[] indices as nothing
    assert estimate(OpCall("aten::index", ([4, 6], []), (F32, ""), ([6, 1], []), ("", ""))) is None
    # when a trace does record them as a TensorList, rows are counted
    c = cost("aten::index", [[100, 6], [[2]]], [F32, "TensorList"], [[6, 1], [[1]]], ["", ""])
    assert c.bytes == 2 * 8 + 2 * 2 * 6 * 4


def test_embedding_bag():
    c = cost("aten::_embedding_bag_forward_only", [[1000, 16], [32], [4], [], [], [], [], [], []],
             [F32, I64, I64, "Scalar", "Scalar", "Scalar", "", "Scalar", "Scalar"],
             [[16, 1], [1], [1], [], [], [], [], [], []], ["", "", "", "False", "1", "False", "", "False", "-1"])
    assert (c.flops, c.bytes) == (32 * 16, 32 * 8 + 4 * 8 + 32 * 16 * 4 + 4 * 16 * 4)


# --- copies, factories, views ----------------------------------------------------------------------------


def test_copy_destination_is_write_only():
    # addmm's CPU child: copy_(out [8,32], bias.expand(8, 32)) -> reads 32 floats, writes 8*32
    c = cost("aten::copy_", [[8, 32], [8, 32], []], [F32, F32, "Scalar"], [[32, 1], [0, 1], []], ["", "", "False"])
    assert (c.flops, c.bytes, c.family) == (0, 32 * 4 + 8 * 32 * 4, "copy")
    # transposed source, dtype conversion float32 -> bfloat16
    c = cost("aten::copy_", [[6, 4], [6, 4], []], [BF16, F32, "Scalar"], [[4, 1], [1, 6], []], ["", "", "False"])
    assert c.bytes == 6 * 4 * 4 + 6 * 4 * 2


def test_cat_over_tensor_list():
    # ViT: cat([cls.expand(4, 1, 768), patches], 1); the expanded cls token has stride 0 on dim 0
    dims = [[[4, 1, 768], [4, 196, 768]], []]
    strides = [[[0, 768, 1], [150528, 1, 196]], []]
    # element dtypes recorded (profile's dispatch pass fills them in): nothing assumed
    c = cost("aten::cat", dims, [[BF16, BF16], "Scalar"], strides, ["", "1"])
    assert (c.flops, c.family, c.note) == (0, "copy", "")
    assert c.bytes == (768 + 4 * 196 * 768) * 2 + 4 * 197 * 768 * 2
    # only "TensorList" (a trace): the caller's hint (the run's most common dtype), noted every time
    hinted = cost("aten::cat", dims, ["TensorList", "Scalar"], strides, ["", "1"], list_dtype=BF16)
    assert hinted.bytes == c.bytes
    assert hinted.note == "TensorList dtype not recorded: assumed bfloat16 (the run's most common dtype)"
    guessed = cost("aten::cat", dims, ["TensorList", "Scalar"], strides, ["", "1"])
    assert guessed.bytes == (768 + 4 * 196 * 768) * 4 + 4 * 197 * 768 * 4
    assert guessed.note == "TensorList dtype not recorded: assumed float32 (default)"
    # mixed element dtypes: each read in its own, the result (promoted) ... written per element as read
    mixed = cost("aten::cat", [[[128, 16], [128, 16]], []], [[I64, I64], "Scalar"], [[[16, 1], [16, 1]], []],
                 ["", "0"])
    assert (mixed.bytes, mixed.note) == (2 * 128 * 16 * 8 * 2, "")


def test_memory_ops():
    c = cost("aten::tril", [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "0"])
    assert c.bytes == 2 * 4 * 6 * 4
    c = cost("aten::reflection_pad1d", [[1, 4, 6], []], [F32, "ScalarList"], [[24, 6, 1], []], ["", "[1, 2]"])
    assert c.bytes == 4 * 6 * 4 + 4 * 9 * 4
    for name in ("aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to", "aten::stack", "aten::repeat",
                 "aten::constant_pad_nd"):
        assert cost(name, [[4, 6], []], [F32, "Scalar"], [[6, 1], []], ["", "0"]).family == "composite"


def test_factories():
    empty = cost("aten::empty", [[], [], [], [], [], []], ["ScalarList", "Scalar", "Scalar", "", "", ""],
                 [[]] * 6, ["[141, 512]", "15", "0", "", "", ""])
    assert (empty.flops, empty.bytes, empty.family) == (0, 0, "factory")
    assert cost("aten::empty_like", [[4, 6], [], [], [], [], []], [F32, "", "", "", "", ""], [[6, 1]] + [[]] * 5,
                [""] * 6).bytes == 0
    assert cost("aten::zeros", [[], [], [], [], []], ["ScalarList", "Scalar", "Scalar", "", ""], [[]] * 5,
                ["[2, 8, 3, 16]", "6", "0", "", ""]).bytes == 2 * 8 * 3 * 16 * 4
    assert cost("aten::full", [[], [], [], [], [], []], ["ScalarList", "Scalar", "", "", "", "Scalar"], [[]] * 6,
                ["[2, 3]", "1.5", "", "", "", "False"]).bytes == 6 * 4
    assert cost("aten::zero_", [[4, 6]], [F32], [[6, 1]], [""]).bytes == 4 * 6 * 4
    assert cost("aten::fill_", [[4, 6], []], [BF16, "Scalar"], [[6, 1], []], ["", "1"]).bytes == 4 * 6 * 2
    assert cost("aten::normal_", [[2, 8], [], [], []], [F32, "Scalar", "Scalar", ""], [[8, 1], [], [], []],
                ["", "0.", "1.", ""]).bytes == 16 * 4
    assert cost("aten::bernoulli_", [[4, 6], [], []], ["bool", "Scalar", ""], [[6, 1], [], []],
                ["", "0.5", ""]).bytes == 4 * 6
    assert cost("aten::ones_like", [[4, 6], [], [], [], [], []], [F32, "", "", "", "Scalar", ""], [[6, 1]] + [[]] * 5,
                ["", "", "", "", "False", ""]).bytes == 4 * 6 * 4
    # arange(10) -> int64; arange(0, 1, 0.1) -> 10 float32; arange.start_out(0, 5, 1, out)
    assert cost("aten::arange", [[]] * 5, ["Scalar", "", "", "", "Scalar"], [[]] * 5,
                ["10", "", "", "", "False"]).bytes == 10 * 8
    assert cost("aten::arange", [[]] * 7, ["Scalar", "Scalar", "Scalar", "", "", "", "Scalar"], [[]] * 7,
                ["0", "1", "0.10000000000000001", "", "", "", "False"]).bytes == 10 * 4
    assert cost("aten::arange", [[], [], [], [0]], ["Scalar", "Scalar", "Scalar", I64], [[], [], [], [1]],
                ["0", "5", "1", ""]).bytes == 5 * 8


@pytest.mark.parametrize("name", ["aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::expand",
                                  "aten::slice", "aten::select", "aten::t", "aten::as_strided", "aten::unsqueeze",
                                  "aten::flatten", "aten::detach", "aten::_unsafe_view", "aten::resize_",
                                  "aten::_local_scalar_dense", "aten::item", "aten::split", "aten::unbind"])
def test_views_are_free(name):
    c = cost(name, [[1, 141, 512], []], [BF16, "ScalarList"], [[72192, 512, 1], []], ["", "[-1]"])
    assert (c.flops, c.bytes, c.family) == (0, 0, "view")


# --- losses -------------------------------------------------------------------------------------------------


def test_nll_and_mse_losses():
    c = cost("aten::nll_loss_forward", [[4, 5], [4], [], [], []], [F32, I64, "", "Scalar", "Scalar"],
             [[5, 1], [1], [], [], []], ["", "", "", "1", "-100"])
    assert (c.flops, c.bytes, c.family) == (2 * 4, 4 * 8 + 4 * 4 + (1 + 1) * 4, "loss")
    b = cost("aten::nll_loss_backward", [[], [4, 5], [4], [], [], [], []], [F32, F32, I64, "", "Scalar", "Scalar", F32],
             [[], [5, 1], [1], [], [], [], []], ["", "", "", "", "1", "-100", ""])
    assert (b.flops, b.bytes) == (4, 4 + 4 * 8 + 4 * 4)  # the zero-fill of grad_input is a child zero_
    # mean: subtract + square per element, x and y read, the unreduced loss written (the child mean reduces)
    m = cost("aten::mse_loss", [[4, 5], [4, 5], []], [F32, F32, "Scalar"], [[5, 1], [5, 1], []], ["", "", "1"])
    assert (m.flops, m.bytes) == (2 * 20, 3 * 20 * 4)
    none = cost("aten::mse_loss", [[4, 5], [4, 5], []], [F32, F32, "Scalar"], [[5, 1], [5, 1], []], ["", "", "0"])
    assert (none.flops, none.bytes) == (2 * 20, 3 * 20 * 4)
    mb = cost("aten::mse_loss_backward", [[], [4, 5], [4, 5], []], [F32, F32, F32, "Scalar"], [[], [5, 1], [5, 1], []],
              ["", "", "", "1"])
    assert (mb.flops, mb.bytes) == (3 * 20, 4 + 2 * 20 * 4 + 20 * 4)
    for name in ("aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd", "aten::l1_loss"):
        assert cost(name, [[4, 5], [4]], [F32, I64], [[5, 1], [1]], ["", ""]).family == "composite"


def test_bce_and_smooth_l1():
    # the unreduced loss written; the reduction (and BCE's weight) are child ops
    c = cost("aten::binary_cross_entropy", [[4, 5], [4, 5], [5], []], [F32, F32, F32, "Scalar"],
             [[5, 1], [5, 1], [1], []], ["", "", "", "1"])
    assert (c.flops, c.bytes) == (9 * 20, 3 * 20 * 4)
    c = cost("aten::smooth_l1_loss", [[4, 5], [4, 5], [], []], [F32, F32, "Scalar", "Scalar"], [[5, 1], [5, 1], [], []],
             ["", "", "1", "1."])
    assert (c.flops, c.bytes) == (4 * 20, 3 * 20 * 4)
    c = cost("aten::huber_loss", [[4, 5], [4, 5], [], []], [F32, F32, "Scalar", "Scalar"], [[5, 1], [5, 1], [], []],
             ["", "", "2", "1."])
    assert (c.flops, c.bytes) == (4 * 20, 3 * 20 * 4)
    zero_beta = cost("aten::smooth_l1_loss", [[4, 5], [4, 5], [], []], [F32, F32, "Scalar", "Scalar"],
                     [[5, 1], [5, 1], [], []], ["", "", "1", "0."])
    assert zero_beta.family == "composite"  # runs as l1_loss's sub / abs / mean
    b = cost("aten::binary_cross_entropy_backward", [[], [4, 5], [4, 5], [5], []], [F32, F32, F32, F32, "Scalar"],
             [[], [5, 1], [5, 1], [1], []], ["", "", "", "", "1"])
    assert (b.flops, b.bytes) == (6 * 20, 4 + 2 * 20 * 4 + 20 * 4)  # the weight: child mul_


# --- optimizer ----------------------------------------------------------------------------------------------

PARAMS = [[16, 8], [16], [4, 16], [4]]
P_STRIDES = [[8, 1], [1], [16, 1], [1]]
N_PARAMS = 16 * 8 + 16 + 4 * 16 + 4


def test_foreach_sgd_ops():
    # SGD(momentum, foreach=True): _foreach_mul_(bufs, 0.9); _foreach_add_(params, grads, alpha=-lr)
    mul = cost("aten::_foreach_mul_", [PARAMS, []], ["TensorList", "Scalar"], [P_STRIDES, []], ["", "0.9"])
    assert (mul.flops, mul.bytes, mul.family) == (N_PARAMS, 2 * N_PARAMS * 4, "elementwise")
    assert "float32" in mul.note
    add = cost("aten::_foreach_add_", [PARAMS, PARAMS, []], [[F32] * 4, [F32] * 4, "Scalar"],
               [P_STRIDES, P_STRIDES, []], ["", "", "-0.1"])
    assert (add.flops, add.bytes, add.note) == (2 * N_PARAMS, 3 * N_PARAMS * 4, "")
    half = cost("aten::_foreach_add_", [PARAMS, PARAMS, []], ["TensorList", "TensorList", "Scalar"],
                [P_STRIDES, P_STRIDES, []], ["", "", "-0.1"], list_dtype=BF16)
    assert half.bytes == 3 * N_PARAMS * 2 and "assumed bfloat16" in half.note
    addcdiv = cost("aten::_foreach_addcdiv_", [PARAMS, PARAMS, PARAMS, []],
                   ["TensorList", "TensorList", "TensorList", "ScalarList"], [P_STRIDES] * 3 + [[]],
                   ["", "", "", "[-0.3, -0.3, -0.3, -0.3]"])
    assert (addcdiv.flops, addcdiv.bytes) == (3 * N_PARAMS, 4 * N_PARAMS * 4)
    norm = cost("aten::_foreach_norm", [PARAMS, [], []], ["TensorList", "Scalar", ""], [P_STRIDES, [], []], ["", "2.", ""])
    assert (norm.flops, norm.bytes, norm.family) == (2 * N_PARAMS + 4, N_PARAMS * 4 + 4 * 4, "reduction")


def test_fused_adam():
    dims = [PARAMS, PARAMS, PARAMS, PARAMS, [], [[], [], [], []]] + [[]] * 9
    types = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]
    c = cost("aten::_fused_adamw_", dims, types, [[]] * 15, [""] * 6 + ["0.1", "0.9", "0.999", "0.01", "1e-08", "False",
                                                                       "False", "", ""])
    # params, exp_avg, exp_avg_sq read and written; grads read
    assert (c.flops, c.bytes) == (14 * N_PARAMS, 4 * N_PARAMS * 4 + 3 * N_PARAMS * 4)


# --- upsampling -------------------------------------------------------------------------------------------


def test_upsampling():
    # F.interpolate(x [1,2,4,5], scale_factor=2): .vec(input, output_size=None, scale_factors) ...
    vec = cost("aten::upsample_nearest2d", [[1, 2, 4, 5], [], []], [F32, "", "ScalarList"], [[40, 20, 5, 1], [], []],
               ["", "", "[2., 2.]"])
    assert (vec.flops, vec.bytes, vec.family) == (0, 1 * 2 * 4 * 5 * 4 + 1 * 2 * 8 * 10 * 4, "gather")
    # ... calling the sized overload (self, output_size, scales_h, scales_w)
    sized = cost("aten::upsample_nearest2d", [[1, 2, 4, 5], [], [], []], [F32, "ScalarList", "Scalar", "Scalar"],
                 [[40, 20, 5, 1], [], [], []], ["", "[8, 10]", "2.", "2."])
    assert (sized.flops, sized.bytes) == (vec.flops, vec.bytes)
    bil = cost("aten::upsample_bilinear2d", [[1, 2, 4, 5], [], [], [], []],
               [F32, "ScalarList", "Scalar", "Scalar", "Scalar"], [[40, 20, 5, 1], [], [], [], []],
               ["", "[8, 10]", "False", "2.", "2."])
    assert (bil.flops, bil.bytes, bil.family) == (2 * 4 * (2 * 8 * 10), (40 + 160) * 4, "elementwise")
    back = cost("aten::upsample_nearest2d_backward", [[1, 2, 8, 10], [], [], [], []],
                [F32, "ScalarList", "ScalarList", "Scalar", "Scalar"], [[0, 0, 0, 0], [], [], [], []],
                ["", "[8, 10]", "[1, 2, 4, 5]", "2.", "2."])
    assert (back.flops, back.bytes) == (2 * 8 * 10, 4 + 2 * 4 * 5 * 4)
