"""Every command on every corruption class: no crash (no traceback), no hang, no code run from a pickle, bounded
memory, and the skip named. Each case runs in its own subprocess under RLIMIT_AS and a timeout.

The default run takes a sample of the corpus (every class represented, about two minutes on two cores); the
exhaustive run is marked slow: ``pytest tests/reliability -m slow``."""

from tests.reliability.corpus import build_cases

SAMPLED = [
    "cell:steps.csv:int:float",
    "cell:steps.csv:int_time:digits20",
    "cell:collectives.csv:category:nonutf8",
    "cell:collectives.csv:float:inf",
    "cell:memory.csv:int:quote",
    "binary_junk_mid_file",
    "random_bytes_file",
    "fifo_manifest",
    "fifo_steps",
    "dev_zero_steps",
    "manifest_deep",
    "manifest_world_size_huge",
    "manifest_peak_zero",
    "manifest_odd_types",
    "rank_dir_huge_number",
    "second_run_appended",
    "swapped_start_duration",
    "pickle_self_list",
    "pickle_code",
    "kineto_deep_metadata",
    "v2_truncated_parquet",
    "v2_junk_in_stream",
    "v2_fifo_segment",
    "fr_pickle_time_huge",
    "kineto_rank_huge",
    "kineto_device_props_dict",
    "events_odd_values",
    "events_many_keys",
    "v2_duplicate_column",
    "v2_parquet_constant_rows",
    "nccl_log_long_prefix",
    "manifest_terminal_escapes",
]


def test_corpus_covers_every_class():
    names = build_cases()
    assert len(names) > 100 and set(SAMPLED) <= set(names)
