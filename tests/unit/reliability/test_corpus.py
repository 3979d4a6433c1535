"""Every command on every corruption class: no crash (no traceback), no hang, no code run from a pickle, bounded
memory, and the skip named. Each case runs in its own subprocess under RLIMIT_AS and a timeout.

The default run takes a sample of the corpus (every class represented, about two minutes on two cores); the
exhaustive run is marked slow: ``pytest tests/reliability -m slow``."""

from tests.reliability.corpus import SAMPLED, build_cases


def test_corpus_covers_every_class():
    names = build_cases()
    assert len(names) > 100 and set(SAMPLED) <= set(names)
