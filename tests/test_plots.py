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
