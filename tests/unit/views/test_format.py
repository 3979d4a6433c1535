"""diag.views.format: the one place views turn numbers into text, each with its unit."""

from __future__ import annotations

import pytest

from diag.views import format as fmt


def test_durations_name_the_unit_they_take():
    assert fmt.ms_from_s(0.01234) == "12.3 ms"
    assert fmt.ms_from_s(0.01234, 2) == "12.34 ms"
    assert fmt.ms_from_us(1234) == "1.23 ms"  # collectives: two decimals by default
    assert fmt.ms_from_us(56) == "0.06 ms"
    assert fmt.s_from_s(12.34) == "12.3 s"


def test_percentages_from_fractions_and_from_percent_values():
    assert fmt.pct(0.1234) == "12.3%"
    assert fmt.pct(0.126, 0) == "13%"
    assert fmt.pct(0.25, 0, signed=True) == "+25%"
    assert fmt.pct(-0.05, 0, signed=True) == "-5%"
    assert fmt.pct_from_pct(12.34) == "12.3%"
    assert fmt.pct_from_pct(87.6, 0) == "88%"


def test_byte_sizes_in_binary_units():
    assert fmt.gib(3 * 2**30) == "3.00 GiB"
    assert fmt.gib(2**29, 1) == "0.5 GiB"
    assert fmt.mib(3 * 2**19) == "1.50 MiB"
    assert fmt.mib(2**20, signed=True) == "+1.00 MiB"
    assert fmt.mib(-(2**21), 1, signed=True) == "-2.0 MiB"
    assert fmt.iec_bytes(512) == "512 B"
    assert fmt.iec_bytes(4096) == "4 KiB"
    assert fmt.iec_bytes(3 * 2**20) == "3 MiB"
    assert fmt.iec_bytes(5 * 2**30) == "5 GiB"
    assert fmt.iec_bytes(1.5 * 2**40) == "1.5 TiB"


def test_rates_have_thousands_separators():
    assert fmt.rate(12345.6, "tokens") == "12,346 tokens/s"
    assert fmt.rate(1234.56, "samples", 1) == "1,234.6 samples/s"
    assert fmt.num(3.14159) == "3.1"
    assert fmt.num(7, "{}") == "7"


@pytest.mark.parametrize(
    "formatter", [fmt.ms_from_s, fmt.ms_from_us, fmt.s_from_s, fmt.pct, fmt.pct_from_pct, fmt.gib, fmt.mib, fmt.num]
)
def test_unknown_values_read_as_a_dash(formatter):
    assert formatter(None) == "-"
    assert fmt.rate(None, "tokens") == "-"
