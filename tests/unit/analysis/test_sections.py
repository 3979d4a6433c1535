"""The registry of the report's sections (report.SECTIONS): the Report, its JSON and its views follow it."""

from __future__ import annotations

import dataclasses

from diag.analysis.report import SECTIONS, Report
from diag.analysis.section import Section
from diag.views.html import SECTION_FIGURES
from diag.views.text import SECTION_BLOCKS


def test_every_field_of_the_report_is_a_section_and_every_section_a_field():
    names = [s.name for s in SECTIONS]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(Report)} - {"run", "findings"}
    assert fields == {s.name for s in SECTIONS if s.in_report}


def test_views_render_sections_of_the_registry():
    names = {s.name for s in SECTIONS}
    assert set(SECTION_BLOCKS) <= names and set(SECTION_FIGURES) <= names


def test_json_keys_of_a_section_present_absent_or_never_in_the_json():
    always, optional = Section("bubble"), Section("links", in_json="when_present")
    assert always.json_keys(None) == {"bubble": None} and optional.json_keys(None) == {}
    assert optional.json_keys({"a": float("nan")}) == {"links": {"a": None}}
    assert Section("pipeline_timeline", in_json="never").json_keys([1]) == {}
    custom = Section("health", json=lambda h: {"health": h} if h else {})
    assert custom.json_keys(0) == {} and custom.json_keys(2) == {"health": 2}


def test_findings_of_a_section_without_a_result_or_without_findings_are_none():
    calls = []
    section = Section("mfu", lambda result, ctx: calls.append(result) or ["found"])
    assert section.findings_of(None, None) == [] and not calls
    assert section.findings_of(3, None) == ["found"] and calls == [3]
    assert Section("timeline").findings_of(3, None) == []
