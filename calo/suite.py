"""The built-in workload suite: 43 operators across vision, language and recommender models.

Every entry has a small shape that builds and measures in well under a second on a laptop CPU,
and a medium and a large one (``<name>@medium``, ``<name>@large``); the paper's seven operators
also have the paper's shape, named ``<name>@paper``. A workload in
params.yaml with the same name overrides the suite entry. Pure data: no TVM import here.

Operators come from TVM's ``te_workload`` module or from ``calo.operators`` (looked up first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PAPER = "paper"
PAPER_SUFFIX = f"@{PAPER}"


@dataclass(frozen=True)
class Entry:
    family: str
    op: str
    small: dict[str, Any]
    paper: dict[str, Any] | None = None
    note: str = ""


def _conv(n, h, ci, co, k, s=1, p=0, **kw) -> dict:
    return {"N": n, "H": h, "W": h, "CI": ci, "CO": co, "kernel_size": k, "stride": s,
            "padding": p, **kw}


SUITE: dict[str, Entry] = {
    # -- the paper's seven operators --------------------------------------------------------
    "gelu-mlp": Entry("language", "gelu_mlp", {"B": 16, "D": 256, "H": 256},
                      {"B": 128, "D": 4096, "H": 4096}, "dense + bias + GeLU"),
    "sdp-attention": Entry("language", "sdp_attention", {"B": 1, "H": 2, "L": 32, "D": 32},
                           {"B": 32, "H": 16, "L": 128, "D": 64}, "softmax(QK^T/sqrt(d)) V"),
    "conv2d": Entry("vision", "conv2d_nchw",
                    {"n": 1, "h": 16, "w": 16, "ci": 16, "co": 16, "kh": 3, "kw": 3,
                     "stride": 1, "padding": 1},
                    {"n": 64, "h": 224, "w": 224, "ci": 64, "co": 64, "kh": 3, "kw": 3,
                     "stride": 1, "padding": 1}),
    "depthwise-conv2d": Entry("vision", "depthwise_conv2d_nhwc",
                              {"N": 1, "H": 28, "W": 28, "C": 16, "kernel_size": 3, "padding": 1},
                              {"N": 1, "H": 56, "W": 56, "C": 72, "kernel_size": 5, "stride": 2,
                               "padding": 2}, "MobileNet-V3 block"),
    "matmul": Entry("dense", "matmul", {"n": 128, "m": 128, "k": 64},
                    {"n": 4096, "m": 4096, "k": 1024}),
    "layer-norm": Entry("language", "layer_norm", {"N": 128, "D": 256},
                        {"N": 4096, "D": 768}, "BERT hidden size, 32x128 tokens"),
    "group-conv2d": Entry("vision", "conv2d_nhwc", _conv(1, 14, 32, 32, 3, p=1, groups=8),
                          _conv(1, 56, 128, 128, 3, p=1, groups=32), "ResNeXt 32x4d"),
    # -- TVM's te_workload operators --------------------------------------------------------
    "conv1d": Entry("vision", "conv1d_nlc",
                    {"N": 1, "L": 64, "CI": 16, "CO": 16, "kernel_size": 3, "padding": 1}),
    "conv2d-nhwc": Entry("vision", "conv2d_nhwc", _conv(1, 14, 32, 32, 3, p=1)),
    "conv3d": Entry("vision", "conv3d_ndhwc",
                    {"N": 1, "D": 4, "H": 8, "W": 8, "CI": 8, "CO": 8, "kernel_size": 3,
                     "padding": 1}),
    "conv2d-transpose": Entry("vision", "conv2d_transpose_nhwc",
                              _conv(1, 8, 16, 16, 4, s=2, p=1)),
    "conv2d-capsule": Entry("vision", "conv2d_capsule_nhwijc",
                            {"N": 1, "H": 8, "W": 8, "CI": 8, "CO": 8, "kernel_size": 3,
                             "padding": 1, "capsule_size": 4}),
    "conv2d-bn-relu": Entry("vision", "conv2d_nhwc_bn_relu",
                            {"N": 1, "H": 14, "W": 14, "CI": 16, "CO": 16, "kernel_size": 3,
                             "strides": 1, "padding": 1}),
    "conv2d-bias-bn-relu": Entry("vision", "conv2d_nchw_bias_bn_relu",
                                 {"n": 1, "h": 14, "w": 14, "ci": 16, "co": 16, "kh": 3, "kw": 3,
                                  "stride": 1, "padding": 1}),
    "max-pool2d": Entry("vision", "max_pool2d_nchw",
                        {"n": 1, "h": 32, "w": 32, "ci": 16, "padding": 1}),
    "batch-matmul": Entry("dense", "batch_matmul_nkkm", {"B": 4, "N": 64, "M": 64, "K": 64}),
    "transpose-batch-matmul": Entry("language", "transpose_batch_matmul",
                                    {"batch": 1, "seq_len": 64, "n_head": 4, "n_dim": 32}),
    "matmul-relu": Entry("dense", "matmul_relu", {"n": 64, "m": 128, "k": 64}),
    "norm": Entry("reduction", "norm_bmn", {"B": 4, "M": 64, "N": 64}),
    "softmax": Entry("language", "softmax_mn", {"m": 64, "n": 256}),
    # -- calo.operators: language models ----------------------------------------------------
    "add-layer-norm": Entry("language", "add_layer_norm", {"N": 128, "D": 256}),
    "rms-norm": Entry("language", "rms_norm", {"N": 128, "D": 256}),
    "silu-and-mul": Entry("language", "silu_and_mul", {"B": 64, "H": 256}),
    "rotary-embedding": Entry("language", "rotary_embedding", {"B": 4, "L": 64, "D": 64}),
    "log-softmax": Entry("language", "log_softmax", {"M": 64, "N": 256}),
    # -- calo.operators: vision -------------------------------------------------------------
    "hardswish": Entry("vision", "hardswish", {"N": 1, "C": 16, "H": 28, "W": 28}),
    "batch-norm-relu": Entry("vision", "batch_norm_relu", {"N": 1, "C": 16, "H": 28, "W": 28}),
    "avg-pool2d": Entry("vision", "avg_pool2d", {"N": 1, "C": 16, "H": 32, "W": 32, "K": 2}),
    "global-avg-pool": Entry("vision", "global_avg_pool", {"N": 1, "C": 64, "H": 14, "W": 14}),
    "squeeze-excite": Entry("vision", "squeeze_excite",
                            {"N": 1, "C": 64, "H": 14, "W": 14, "R": 4}),
    "upsample-nearest": Entry("vision", "upsample_nearest",
                              {"N": 1, "C": 16, "H": 16, "W": 16, "S": 2}),
    "nchw-to-nhwc": Entry("vision", "nchw_to_nhwc", {"N": 1, "C": 32, "H": 16, "W": 16}),
    "pad2d": Entry("vision", "pad2d", {"N": 1, "C": 16, "H": 28, "W": 28, "P": 1}),
    # -- calo.operators: dense algebra and reductions ---------------------------------------
    "gemv": Entry("dense", "gemv", {"M": 256, "K": 256}),
    "dense-bias-relu": Entry("dense", "dense_bias_relu", {"B": 16, "D": 256, "H": 128}),
    "row-sum": Entry("reduction", "row_sum", {"M": 128, "N": 256}),
    "l2-normalize": Entry("reduction", "l2_normalize", {"N": 128, "D": 128}),
    # -- calo.operators: recommender models -------------------------------------------------
    "mlp2": Entry("recommender", "mlp2", {"B": 32, "D": 64, "H": 128, "O": 32}),
    "embedding-gather": Entry("recommender", "embedding_gather", {"V": 1000, "D": 64, "B": 128}),
    "embedding-bag-sum": Entry("recommender", "embedding_bag_sum",
                               {"V": 1000, "D": 32, "B": 64, "P": 8}),
    "dcn-cross": Entry("recommender", "dcn_cross", {"B": 64, "D": 128}),
    "dot-interaction": Entry("recommender", "dot_interaction", {"B": 32, "F": 8, "D": 32}),
    "fm-interaction": Entry("recommender", "fm_interaction", {"B": 64, "F": 16, "D": 16}),
}

# Larger shapes of every operator, <name>@medium and <name>@large: the small shape with these
# arguments changed. Tiling and vectorization choices depend on shape, so the donor sees each
# operator at three; large ones stay within a second per measurement on a laptop CPU.
GROWN: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gelu-mlp": ({"B": 32, "D": 512, "H": 256},
                 {"B": 64, "D": 768, "H": 512}),
    "sdp-attention": ({"B": 1, "H": 4, "L": 64, "D": 32},
                      {"B": 2, "H": 8, "L": 128, "D": 64}),
    "conv2d": ({"h": 28, "w": 28, "ci": 32, "co": 32},
               {"h": 56, "w": 56, "ci": 32, "co": 64}),
    "depthwise-conv2d": ({"H": 56, "W": 56, "C": 32},
                         {"H": 112, "W": 112, "C": 32, "kernel_size": 5, "padding": 2}),
    "matmul": ({"n": 256, "m": 256, "k": 128},
               {"n": 512, "m": 256, "k": 256}),
    "layer-norm": ({"N": 512, "D": 512},
                   {"N": 2048, "D": 768}),
    "group-conv2d": ({"H": 28, "W": 28, "CI": 64, "CO": 64, "groups": 16},
                     {"H": 56, "W": 56, "CI": 128, "CO": 128, "groups": 32}),
    "conv1d": ({"L": 256, "CI": 32, "CO": 32},
               {"L": 1024, "CI": 64, "CO": 64}),
    "conv2d-nhwc": ({"H": 28, "W": 28, "CI": 64, "CO": 64},
                    {"H": 56, "W": 56, "CI": 64, "CO": 64}),
    "conv3d": ({"D": 8, "H": 16, "W": 16, "CI": 16, "CO": 16},
               {"D": 16, "H": 28, "W": 28, "CI": 16, "CO": 32}),
    "conv2d-transpose": ({"H": 16, "W": 16, "CI": 32, "CO": 32},
                         {"H": 32, "W": 32, "CI": 64, "CO": 32}),
    "conv2d-capsule": ({"H": 16, "W": 16, "CI": 16, "CO": 16},
                       {"H": 16, "W": 16, "CI": 32, "CO": 32}),
    "conv2d-bn-relu": ({"H": 28, "W": 28, "CI": 32, "CO": 32},
                       {"H": 56, "W": 56, "CI": 64, "CO": 64}),
    "conv2d-bias-bn-relu": ({"h": 28, "w": 28, "ci": 32, "co": 32},
                            {"h": 56, "w": 56, "ci": 64, "co": 64}),
    "max-pool2d": ({"h": 64, "w": 64, "ci": 32},
                   {"h": 112, "w": 112, "ci": 64}),
    "batch-matmul": ({"B": 8, "N": 128, "M": 128, "K": 64},
                     {"B": 16, "N": 256, "M": 128, "K": 128}),
    "transpose-batch-matmul": ({"seq_len": 128, "n_head": 8},
                               {"seq_len": 256, "n_head": 12, "n_dim": 64}),
    "matmul-relu": ({"n": 256, "m": 256, "k": 128},
                    {"n": 512, "m": 512, "k": 128}),
    "norm": ({"B": 8, "M": 128, "N": 128},
             {"B": 16, "M": 256, "N": 256}),
    "softmax": ({"m": 256, "n": 512},
                {"m": 1024, "n": 1024}),
    "add-layer-norm": ({"N": 512, "D": 512},
                       {"N": 2048, "D": 768}),
    "rms-norm": ({"N": 512, "D": 512},
                 {"N": 2048, "D": 1024}),
    "silu-and-mul": ({"B": 256, "H": 512},
                     {"B": 1024, "H": 1024}),
    "rotary-embedding": ({"B": 8, "L": 128, "D": 64},
                         {"B": 16, "L": 512, "D": 128}),
    "log-softmax": ({"M": 256, "N": 512},
                    {"M": 1024, "N": 1024}),
    "hardswish": ({"C": 32, "H": 56, "W": 56},
                  {"C": 64, "H": 112, "W": 112}),
    "batch-norm-relu": ({"C": 32, "H": 56, "W": 56},
                        {"C": 64, "H": 112, "W": 112}),
    "avg-pool2d": ({"C": 32, "H": 64, "W": 64},
                   {"C": 64, "H": 112, "W": 112}),
    "global-avg-pool": ({"C": 128, "H": 28, "W": 28},
                        {"C": 512, "H": 14, "W": 14}),
    "squeeze-excite": ({"C": 128, "H": 28, "W": 28},
                       {"C": 256, "H": 28, "W": 28, "R": 8}),
    "upsample-nearest": ({"C": 32, "H": 32, "W": 32},
                         {"C": 64, "H": 64, "W": 64}),
    "nchw-to-nhwc": ({"C": 64, "H": 32, "W": 32},
                     {"C": 128, "H": 56, "W": 56}),
    "pad2d": ({"C": 32, "H": 56, "W": 56},
              {"C": 64, "H": 112, "W": 112}),
    "gemv": ({"M": 1024, "K": 512},
             {"M": 4096, "K": 1024}),
    "dense-bias-relu": ({"B": 32, "D": 512, "H": 256},
                        {"B": 64, "D": 1024, "H": 512}),
    "row-sum": ({"M": 512, "N": 512},
                {"M": 2048, "N": 1024}),
    "l2-normalize": ({"N": 512, "D": 256},
                     {"N": 2048, "D": 512}),
    "mlp2": ({"B": 64, "D": 128, "H": 256, "O": 64},
             {"B": 128, "D": 256, "H": 512, "O": 128}),
    "embedding-gather": ({"V": 10000, "D": 64, "B": 512},
                         {"V": 100000, "D": 128, "B": 2048}),
    "embedding-bag-sum": ({"V": 10000, "D": 64, "B": 256},
                          {"V": 100000, "D": 64, "B": 1024, "P": 16}),
    "dcn-cross": ({"B": 256, "D": 256},
                  {"B": 1024, "D": 512}),
    "dot-interaction": ({"B": 128, "F": 16, "D": 32},
                        {"B": 512, "F": 27, "D": 64}),
    "fm-interaction": ({"B": 256, "F": 32, "D": 16},
                       {"B": 1024, "F": 39, "D": 16}),
}

PAPER_OPERATORS = [n for n, e in SUITE.items() if e.paper is not None]
SHAPES = ("small", "medium", "large")   # what `--suite` harvests; "paper" is asked for by name


def resolve(name: str) -> tuple[str, dict[str, Any]] | None:
    """(op, args) of a suite workload name, ``<name>`` or ``<name>@<shape>``; None if unknown."""
    base, _, shape = name.partition("@")
    entry = SUITE.get(base)
    if entry is None:
        return None
    if shape in ("", "small"):
        return entry.op, dict(entry.small)
    if shape == PAPER:
        return (entry.op, dict(entry.paper)) if entry.paper is not None else None
    if shape in SHAPES:
        return entry.op, {**entry.small, **GROWN[base][SHAPES.index(shape) - 1]}
    return None


def family(name: str) -> str:
    entry = SUITE.get(name.partition("@")[0])
    return entry.family if entry else "custom"


def operator(name: str) -> str:
    """The suite operator a workload name is a shape of (the name itself if not the suite's)."""
    return name.partition("@")[0]


def names(shape: str = "small") -> list[str]:
    """Suite workload names at one shape ("small", "medium", "large", "paper") or "all" three."""
    if shape == "all":
        return [n for s in SHAPES for n in names(s)]
    if shape == PAPER:
        return [n + PAPER_SUFFIX for n in PAPER_OPERATORS]
    if shape not in SHAPES:
        raise ValueError(f"unknown suite shape {shape!r}: one of {', '.join(SHAPES)}, paper, all")
    return list(SUITE) if shape == "small" else [f"{n}@{shape}" for n in SUITE]
