"""The README's metric table is generated from the catalogue; this keeps them in step."""

from __future__ import annotations

from pathlib import Path

from dra_exporter.catalog import CATALOG, DCGM_CATALOG, dcgm_markdown_table, markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_metrics_table_matches_the_catalogue() -> None:
    text = README.read_text()
    start, end = text.index("<!-- metrics:start -->\n"), text.index("<!-- metrics:end -->")
    table = text[start + len("<!-- metrics:start -->\n"):end].strip()
    assert table == markdown_table(), "regenerate with: python -m dra_exporter.catalog"


def test_every_catalogue_name_is_unique_and_counters_end_in_total() -> None:
    names = [s.name for s in CATALOG]
    assert len(names) == len(set(names))
    for s in CATALOG:
        assert s.name.startswith("dra_")
        assert (s.kind == "counter") == s.name.endswith("_total"), s.name
        assert len(s.labels) <= 15, s.name
        assert s.help.endswith("."), s.name


def test_readme_dcgm_table_matches_the_catalogue() -> None:
    text = README.read_text()
    start, end = text.index("<!-- dcgm:start -->\n"), text.index("<!-- dcgm:end -->")
    table = text[start + len("<!-- dcgm:start -->\n"):end].strip()
    assert table == dcgm_markdown_table(), "regenerate with: python -m dra_exporter.catalog dcgm"


def test_dcgm_names_are_dcgms_raw_field_names() -> None:
    for d in DCGM_CATALOG:
        assert d.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")) and d.name.isupper(), d.name
        assert not d.name.endswith("_total"), d.name
        assert d.source in {s.name for s in CATALOG}, d.source
