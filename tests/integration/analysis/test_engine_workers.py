"""The analysis engine's runner in worker processes (a process pool forked here): the ranks read from their files
in two workers, two ranks a batch, give the loaded trace's result, as the inline runs of
tests/unit/analysis/test_engine.py do."""

from tests.analysis.helpers import engine_read_equals_loaded


def test_ranks_read_in_two_worker_processes_give_the_loaded_result(tmp_path, monkeypatch):
    engine_read_equals_loaded(tmp_path, monkeypatch, batch_ranks=2, workers=2)


def test_the_two_stages_in_worker_processes_equal_the_inline_run(tmp_path, monkeypatch):
    """The collectives (a two-stage analysis) in two and three worker processes, each keeping its share's parts
    between the stages, and inline with every rank read again: the inline run's result (the float sums of
    waits added share by share: equal to 1e-6 us)."""
    from collections import Counter

    from diag.analysis import engine
    from diag.analysis.collective_waits import Collectives
    from diag.analysis.partitioned import load_without_collectives
    from diag.analysis.window import choose_window
    from diag.testing import synthetic
    from tests.analysis.two_stage import SpreadAnalysis, comparable, expected_spread, sources_of

    synthetic.generate(tmp_path, 7, 20, 3, trace_format=2)
    trace = load_without_collectives(tmp_path)
    analysis, sources = Collectives(choose_window(trace.steps, None, set())), engine.rank_sources(trace)
    inline = comparable(engine.run_two_stage(analysis, sources))
    for workers in (2, 3):
        in_workers = comparable(engine.run_two_stage(analysis, sources, workers=workers))
        assert inline[0].equals(in_workers[0]) and inline[1:] == in_workers[1:]
    monkeypatch.setattr(engine, "HELD_BYTES_MAX", 0)
    again = comparable(engine.run_two_stage(analysis, sources))
    assert inline[0].equals(again[0]) and inline[1:] == again[1:]
    ranks = [3, 1, 4, 0, 5, 9, 2, 6]  # an exact analysis: the same result in any number of workers
    for workers in (1, 2, 5):
        assert engine.run_two_stage(SpreadAnalysis(Counter()), sources_of(ranks), workers=workers) == expected_spread(
            ranks
        )
