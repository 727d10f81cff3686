import struct

from calo import plots


def _size(png) -> tuple[int, int]:
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # the IHDR chunk: width, height


def test_many_subjects_get_one_panel_each_a_few_share_one_axes(tmp_path):
    def curves(subjects):
        return {f"{s} {m}": [(t, 2.0 - t / 10) for t in range(1, 6)]
                for s in subjects for m in ("calo", "xgb")}

    few = plots.latency_over_time(tmp_path / "few.png", curves(["a", "b"]), "t")
    many = plots.latency_over_time(tmp_path / "many.png", curves("abcde"), "t")
    (few_w, few_h), (many_w, many_h) = _size(few), _size(many)
    assert many_w > 1.4 * few_w and many_h > 1.2 * few_h  # three columns, two rows
    trials = plots.best_so_far(tmp_path / "trials.png", {"a calo": [3.0, 2.0, 2.0]}, "t")
    assert _size(trials)[0] < 1.2 * few_w  # one axes too


def test_long_workload_names_stay_inside_their_panels(tmp_path):
    """Workloads named as TVM names them from a plain database's IR (every block of a fused
    program): the panels' titles wrap, so the figure is as wide as with short names."""
    long = ["T_softmax_maxelem 384x768 +T_softmax_exp+T_softmax_expsum+T_softmax_norm",
            "conv2d_transpose_nhwc 1x24x24x24x4x4x48 +PadInput+T_add+T_relu+T_multiply",
            "depth_conv2d_nhwc 1x40x40x48x3x3 +PadInput", "C 384x192x320"]
    curves = {f"{s} {m}": [1.0 + 1 / t for t in range(1, 6)] for s in long for m in ("calo", "xgb")}
    short = {f"{s} {m}": points for (s, m), points in
             zip([(c, m) for c in "abcd" for m in ("calo", "xgb")], curves.values())}
    wide = plots.best_so_far(tmp_path / "long.png", curves, "t")
    narrow = plots.best_so_far(tmp_path / "short.png", short, "t")
    assert _size(wide)[0] <= 1.02 * _size(narrow)[0]
