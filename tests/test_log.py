from calo.log import Progress


def test_progress_lines_say_the_pace_and_what_is_left_then_how_long_it_took():
    progress = Progress("extract d", 10, "records")
    progress.start -= 4.0  # four seconds in
    progress.done = 4
    assert progress.line() == "extract d: 4/10 records, 1.00 records/s, ETA 6s"
    progress.done = 10
    assert progress.line("3 failed").startswith("extract d: 10/10 records in 4.0 s, 2.50 records/s")
    assert progress.line("3 failed").endswith("(3 failed)")
    # found cached in no time: no rate of millions a second
    instant = Progress("evaluate: warm-up graphs", 64, "records")
    instant.done = 64
    assert instant.line().startswith("evaluate: warm-up graphs: 64/64 records in 0.0 s")
    assert "/s" not in instant.line()
