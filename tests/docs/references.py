"""What the docs name in the code, read out of Markdown: file paths (in code spans and links), dotted module
paths, `python -m` modules and links' #anchors, each with the file and line it was found on, and whether it
exists in this checkout."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "simulator", "theory", "saguaro", "server", "benchmarks", "tests")
TOP_LEVEL = PACKAGES + (
    "docs",
    "reports",
    "scripts",
    "requirements",
    "README.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "pyproject.toml",
)
PLACEHOLDER = re.compile(r"[<>*{}…]|\.\.\.|\bX\b|\bNAME\b")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(([^)\s]+)\)")
RUN_MODULE = re.compile(r"python3? -m ([^\s`]+)")
DOTTED = re.compile(r"^(" + "|".join(PACKAGES) + r")(\.[A-Za-z_]\w*)+$")
# a path is a file with its extension (a test with ::name) or a folder with its slash; a bare a/b is not taken
# for one (SSD's store keys read saguaro/worker_ready)
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*(\.\w+(::\w+)?|/)$")


@dataclass(frozen=True)
class Reference:
    doc: str  # the Markdown file, relative to the checkout
    line: int
    kind: str  # "path", "module", "python -m" or "anchor" (a Markdown file#heading)
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.kind} {self.text}"


def blocks(text: str) -> list[tuple[int, str, bool]]:
    """(first line, text, in a fenced block) of the Markdown's blocks: a paragraph (its lines joined, so that a
    code span may cross a line break), a table row, a heading, or one line of a fenced block."""
    out, fenced, paragraph = [], False, None
    for number, line in enumerate(text.splitlines(), 1):
        starts_fence = line.lstrip().startswith("```")
        if fenced or starts_fence or not line.strip() or line.lstrip().startswith(("|", "#", "- ", "* ")):
            paragraph = None
        if starts_fence:
            fenced = not fenced
        elif fenced:
            out.append((number, line, True))
        elif line.strip() and paragraph is not None:
            out[paragraph] = (out[paragraph][0], out[paragraph][1] + " " + line.strip(), False)
        elif line.strip():
            out.append((number, line, False))
            paragraph = None if line.lstrip().startswith(("|", "#")) else len(out) - 1
    return out


def _spans(text: str) -> list[tuple[int, str, bool]]:
    """(line, text, in a fenced block) of every inline code span and of every line of a fenced block."""
    out = []
    for number, block, fenced in blocks(text):
        if fenced:
            out.append((number, block, True))
        else:
            out += [(number, m.group(2).strip(), False) for m in CODE_SPAN.finditer(block)]
    return out


def references(doc: Path) -> list[Reference]:
    """Every path, dotted module path and `python -m` module that `doc` names (placeholders left out)."""
    text = doc.read_text(encoding="utf-8")
    name = doc.relative_to(ROOT).as_posix()
    found: list[Reference] = []
    for number, span, fenced in _spans(text):
        found += [
            Reference(name, number, "python -m", module)
            for module in RUN_MODULE.findall(span)
            if not PLACEHOLDER.search(module)
        ]
        for word in re.split(r"[\s,;=()'\"]+", span):
            word = word.rstrip(".:")
            if not word or PLACEHOLDER.search(word) or word.startswith(("http", "-")):
                continue
            if DOTTED.match(word) and not fenced:
                found.append(Reference(name, number, "module", word))
            elif PATH.match(word) and word.split("/")[0].split("::")[0] in TOP_LEVEL:
                found.append(Reference(name, number, "path", word))
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            if not resolved.is_relative_to(ROOT):
                continue
            relative = resolved.relative_to(ROOT).as_posix() or "."
            if path:
                found.append(Reference(name, number, "path", relative))
            if anchor and resolved.suffix == ".md":
                found.append(Reference(name, number, "anchor", f"{relative}#{anchor}"))
    return found


def heading_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives the headings of `doc`: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered -1, -2, ..."""
    anchors, seen, fenced = set(), {}, False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = match.group(1).lower()
            slug = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN").replace(" ", "-")
            repeat = seen.get(slug, 0)
            seen[slug] = repeat + 1
            anchors.add(slug if not repeat else f"{slug}-{repeat}")
    return anchors


def _spec(name: str):
    """The module's spec, None where there is none; a module of this project only from this checkout (an
    editable install of another checkout would otherwise answer for a module this one no longer has)."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or name.split(".")[0] not in PACKAGES:
        return spec
    where = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), None)
    return spec if where and Path(where).resolve().is_relative_to(ROOT) else None


@cache
def _module(name: str):
    return importlib.import_module(name)


def _has(obj, name: str) -> bool:
    return (
        hasattr(obj, name)
        or name in getattr(obj, "__dataclass_fields__", {})
        or name in getattr(obj, "__annotations__", {})
    )


def _defined_in(path: Path, name: str) -> bool:
    """`name` is a function or class (at any depth) of the Python file `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
        for node in ast.walk(tree)
    )


def exists(ref: Reference) -> bool:
    if ref.kind == "anchor":
        path, _, anchor = ref.text.partition("#")
        return (ROOT / path).is_file() and anchor in heading_anchors(ROOT / path)
    if ref.kind == "path":
        path, _, test = ref.text.partition("::")
        target = ROOT / path
        return target.exists() and (not test or _defined_in(target, test))
    if ref.kind == "python -m":
        spec = _spec(ref.text)
        if spec is None:
            return False
        return spec.submodule_search_locations is None or _spec(ref.text + ".__main__") is not None
    parts = ref.text.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
        if _spec(".".join(parts[:cut])) is not None:
            break
    else:
        return False
    obj = _module(".".join(parts[:cut]))
    for attribute in parts[cut:]:
        if not _has(obj, attribute):
            return False
        obj = getattr(obj, attribute, None)
    return True
