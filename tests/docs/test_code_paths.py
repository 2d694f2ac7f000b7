"""Every piece of code the docs name exists: each file or folder path, each dotted module path (down to the
function, class or constant), each `python -m` module and each link's #heading, in the README files, the
contributing guide, the changelog and docs/ (tests/docs/references.py reads them out of the Markdown)."""

from __future__ import annotations

import pytest

from tests.docs.references import ROOT, Reference, exists, references

DOCS = [
    ROOT / name
    for name in (
        "README.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "engine/ssd/README.md",
        "simulator/README.md",
        "benchmarks/README.md",
        "reports/README.md",
    )
]
DOCS += sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.relative_to(ROOT).as_posix())
def test_every_path_module_and_heading_a_doc_names_exists(doc):
    missing = [str(ref) for ref in references(doc) if not exists(ref)]
    assert not missing, "named in the docs but not in the code:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "ref, found",
    [
        (Reference("x.md", 1, "path", "engine/llm.py"), True),
        (Reference("x.md", 1, "path", "engine/no_such_file.py"), False),
        (Reference("x.md", 1, "path", "tests/docs/test_code_paths.py::test_the_reader_can_fail"), True),
        (Reference("x.md", 1, "path", "tests/docs/test_code_paths.py::no_such_test"), False),
        (Reference("x.md", 1, "module", "engine.config.COMMAND_LINE_DEFAULTS"), True),
        (Reference("x.md", 1, "module", "engine.config.NO_SUCH_NAME"), False),
        (Reference("x.md", 1, "module", "saguaro.runfolder"), False),
        (Reference("x.md", 1, "python -m", "saguaro.cli"), True),
        (Reference("x.md", 1, "python -m", "benchmarks.no_such_benchmark"), False),
        (Reference("x.md", 1, "anchor", "docs/cli.md#saguaro-bench"), True),
        (Reference("x.md", 1, "anchor", "docs/cli.md#no-such-heading"), False),
    ],
    ids=str,
)
def test_the_reader_can_fail(ref, found):
    """The negative control: names that are not in the code are found missing, and those that are, found."""
    assert exists(ref) is found


def test_the_reader_finds_paths_modules_and_anchors_in_markdown(tmp_path, monkeypatch):
    doc = ROOT / "docs" / "cli.md"
    kinds = {ref.kind for ref in references(doc)}
    assert {"path", "module", "python -m", "anchor"} <= kinds
    placeholders = [ref for ref in references(doc) if "<" in ref.text or "*" in ref.text]
    assert placeholders == []  # runs/<run folder> and --*-quant are placeholders, not names
