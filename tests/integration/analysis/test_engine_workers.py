"""The analysis engine's runner in worker processes (a process pool forked here): the ranks read from their files
in two workers, two ranks a batch, give the loaded trace's result, as the inline runs of
tests/unit/analysis/test_engine.py do."""

from tests.analysis.helpers import engine_read_equals_loaded


def test_ranks_read_in_two_worker_processes_give_the_loaded_result(tmp_path, monkeypatch):
    engine_read_equals_loaded(tmp_path, monkeypatch, batch_ranks=2, workers=2)
