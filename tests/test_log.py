from calo.log import Progress


def test_progress_lines_say_the_pace_and_what_is_left_then_how_long_it_took():
    progress = Progress("extract d", 10, "records")
    progress.start -= 6.0  # six seconds in: two of start-up, then 1 record, then 4 more in 4 s
    progress.first = (progress.start + 2.0, 1)
    progress.done = 5
    assert progress.line() == "extract d: 5/10 records, 1.00 records/s, ETA 5s"
    progress.done = 10
    assert progress.line("3 failed").startswith("extract d: 10/10 records in 6.0 s, 1.67 records/s")
    assert progress.line("3 failed").endswith("(3 failed)")
    # found cached in no time: no rate of millions a second
    instant = Progress("evaluate: warm-up graphs", 64, "records")
    instant.done = 64
    assert instant.line().startswith("evaluate: warm-up graphs: 64/64 records in 0.0 s")
    assert "/s" not in instant.line()


def test_the_first_items_line_gives_no_pace_for_the_rest():
    progress = Progress("extract d", 8777, "records")
    progress.start -= 20.0       # the workers' start-up, then the first chunk
    progress.advance(64, note="first chunk")
    assert progress.line() == "extract d: 64/8777 records"    # no ETA of 2,700 s
    progress.first = (progress.first[0] - 10.0, 64)           # 640 more in the next 10 s
    progress.done = 704
    rate = float(progress.line().split(", ")[1].split()[0])
    assert 63.0 < rate <= 64.0                                # not 704 / 30 s = 23
