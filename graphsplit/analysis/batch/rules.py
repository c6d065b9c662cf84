"""One table: ATen op name -> the rule relating its inputs' dim labels to its outputs'
(layout.py, compute.py). An op ATen tags pointwise needs no entry."""

from __future__ import annotations

from ...ir.op_kinds import MATRIX_TRANSPOSES, RESHAPES, SPLITS, TRANSPOSES
from .compute import (
    attention,
    batch_norm,
    cdist,
    channels_first,
    couple_dims,
    ctc,
    group_norm,
    last,
    loss_rule,
    mm,
    nll,
    norm_last,
    pointwise,
    reduce,
)
from .layout import (
    arange,
    cat,
    constant,
    copy,
    embedding,
    embedding_bag,
    expand,
    factory,
    gather,
    index_put,
    index_rule,
    like,
    no_tensor,
    permute,
    positions,
    scatter,
    select,
    slice_rule,
    split_rule,
    stack,
    view,
    view_as_complex,
    view_as_real,
)
from .lineup import Rule

__all__ = ["RULES", "pointwise"]

RULES: dict[str, Rule] = {}
for rule, names in (
    (like, ("clone", "_to_copy", "detach", "alias", "lift_fresh_copy", "contiguous", "native_dropout", "dropout",
             "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
             "bernoulli", "_conj", "conj", "resolve_conj", "resolve_neg", "fill", "zero", "uniform", "normal",
             "exponential", "_conj_physical", "conj_physical", "real", "imag", "angle", "abs")),
    (arange, ("arange",)),
    (factory, ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "linspace",
                "empty_strided", "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor", "eye", "tril_indices",
                "triu_indices", "new_empty_strided")),
    (constant, ("lift_fresh", "_tensor_constant")),
    (view, RESHAPES),
    (view_as_complex, ("view_as_complex",)),
    (view_as_real, ("view_as_real",)),
    (permute, (*TRANSPOSES, *MATRIX_TRANSPOSES)),
    (expand, ("expand", "expand_copy")),
    (slice_rule, ("slice", "narrow", "slice_copy")),
    (select, ("select",)),
    (split_rule, (*SPLITS, "tensor_split", "unsafe_split", "unsafe_split_with_sizes")),
    (cat, ("cat", "concat", "concatenate")),
    (stack, ("stack",)),
    (couple_dims("dim"), ("_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp",
                           "cummax", "cummin", "sort", "argsort", "topk", "_softmax_backward_data", "kthvalue",
                           "median", "mode", "glu")),
    (couple_dims("dims"), ("flip", "roll", "_fft_r2c", "_fft_c2r", "_fft_c2c")),
    (couple_dims("repeats", None), ("repeat",)),
    (last(2), ("tril", "triu", "diagonal", "diag_embed", "trace")),
    (reduce, ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "std_mean",
               "logsumexp", "norm", "linalg_vector_norm", "prod", "all", "any", "count_nonzero", "nansum", "nanmean")),
    (loss_rule(1), ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div")),
    (ctc, ("_ctc_loss",)),
    (nll, ("nll_loss_forward", "nll_loss2d_forward", "nll_loss", "nll_loss_nd", "nll_loss2d")),
    (mm, ("mm", "addmm", "bmm", "baddbmm", "matmul", "mv", "addmv", "dot")),
    (attention, ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_fused_attention_overrideable")),
    (embedding, ("embedding",)),
    (embedding_bag, ("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag")),
    (cdist, ("_cdist_forward", "cdist", "_euclidean_dist")),
    (gather, ("gather", "index_select", "take_along_dim")),
    (index_rule, ("index", "_unsafe_index")),
    (scatter, ("scatter", "scatter_add", "scatter_reduce", "index_add")),
    (positions, ("nonzero", "argwhere", "masked_select", "nonzero_numpy")),
    (index_put, ("index_put", "_index_put_impl", "_unsafe_index_put")),
    (norm_last, ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm")),
    (batch_norm, ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "_native_batch_norm_legit_no_training", "batch_norm", "_batch_norm_impl_index",
                   "cudnn_batch_norm", "_batch_norm_with_update", "_batch_norm_no_update")),
    (group_norm, ("native_group_norm",)),
    (channels_first("conv"), ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                               "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution")),
    (channels_first("pool"), ("max_pool2d_with_indices", "max_pool1d", "max_pool2d", "max_pool3d_with_indices",
                               "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                               "_adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool3d",
                               "adaptive_max_pool2d", "adaptive_max_pool1d", "upsample_nearest1d",
                               "upsample_nearest2d", "upsample_bilinear2d", "upsample_linear1d", "upsample_bicubic2d",
                               "_upsample_nearest_exact2d", "constant_pad_nd", "reflection_pad1d",
                               "reflection_pad2d", "replication_pad1d", "replication_pad2d", "pixel_shuffle",
                               "pixel_unshuffle", "im2col", "col2im")),
    (copy, ("copy", "copy_")),
    (no_tensor, ("_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense",
                  "_assert_async", "set_", "record_stream", "_assert_scalar", "item")),
):
    for _n in names:
        RULES[_n] = rule
RULES["masked_fill"] = pointwise
RULES["complex"] = pointwise
RULES["polar"] = pointwise
RULES["where"] = pointwise
RULES["clamp"] = pointwise
