"""docs/api.md against the engine: every name it says `engine` exports is exported, every name it uses
resolves, every import it shows runs, and every call it shows (in its example and in its prose) fits the
signature of what it calls. Calls are bound, not run, except the settings' dataclasses, which are built with
the documented values: a call that would fail with a TypeError (an argument renamed without notice) fails here.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import re

import pytest

from tests.docs.references import ROOT, blocks

API_MD = ROOT / "docs" / "api.md"
TEXT = API_MD.read_text(encoding="utf-8")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# the documented example's variables and what they hold
RECEIVERS = {
    "llm": ("engine.llm", "LLM"),
    "llm.config": ("engine.config", "EngineConfig"),
    "out": ("engine.outputs", "Generation"),
    "out.metrics": ("engine.metrics", "RunMetrics"),
    "o": ("engine.outputs", "RequestOutput"),
    "o.metrics": ("engine.metrics", "RequestMetrics"),
    "chunk": ("engine.outputs", "Chunk"),
}
BUILT = ("SamplingParams", "SpeculativeConfig", "QuantConfig", "CompileConfig")  # cheap to build: built


class Placeholder:
    """An argument the doc leaves to the reader (`messages`, `N`, `...`)."""


def example_code(text: str = TEXT) -> list[str]:
    """The fenced python blocks."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def inline_code(text: str = TEXT) -> list[str]:
    return [m.group(2) for _, block, fenced in blocks(text) if not fenced for m in CODE_SPAN.finditer(block)]


def namespace() -> dict[str, object]:
    """The names the doc may use: builtins, engine's exports, and the public names of each engine module the
    doc names (`engine.compile_config`)."""
    import engine

    names = dict(vars(builtins))
    names.update({name: getattr(engine, name) for name in engine.__all__})
    names["engine"] = engine
    for span in inline_code():
        if re.fullmatch(r"engine(\.\w+)+", span) and importlib.util.find_spec(span) is not None:
            module = importlib.import_module(span)
            names.update({n: v for n, v in vars(module).items() if not n.startswith("_")})
    return names


def receiver(node: ast.AST) -> object | None:
    """The class a documented variable (llm, out.metrics, ...) holds, or None."""
    try:
        where = RECEIVERS.get(ast.unparse(node))
    except (ValueError, TypeError):
        return None
    return None if where is None else getattr(importlib.import_module(where[0]), where[1])


def callee(node: ast.expr, names: dict) -> inspect.Signature | None:
    """The signature of what the doc calls: a name the reader has, or a method of a documented variable (bound:
    without self)."""
    if isinstance(node, ast.Name):
        return inspect.signature(names[node.id]) if node.id in names else None
    if isinstance(node, ast.Attribute):
        owner = receiver(node.value)
        if owner is not None and not hasattr(owner, node.attr):
            return None
        if owner is not None:  # an instance: its method, self bound
            method = inspect.getattr_static(owner, node.attr)
            signature = inspect.signature(getattr(owner, node.attr))
            if isinstance(method, (staticmethod, classmethod)):
                return signature
            return signature.replace(parameters=list(signature.parameters.values())[1:])
        if isinstance(node.value, ast.Name) and node.value.id in names:  # a module's or a class's attribute
            return inspect.signature(getattr(names[node.value.id], node.attr))
    return None


def value(node: ast.expr, names: dict) -> object:
    """The argument as the doc writes it, evaluated where it can be; a Placeholder where it names the reader's."""
    try:
        return eval(compile(ast.Expression(node), "<docs/api.md>", "eval"), dict(names))
    except Exception:  # noqa: BLE001  a name the doc leaves to the reader
        return Placeholder()


def calls(text: str = TEXT) -> list[tuple[str, ast.Call]]:
    """(source, call) of every call in the example blocks and in inline code that parses as Python; in prose,
    `llm.generate()` names the method rather than calls it without arguments, and is left to the test of names."""
    out = []
    for code, prose in [(c, False) for c in example_code(text)] + [(c, True) for c in inline_code(text)]:
        try:
            tree = None if prose and "/" in code else ast.parse(code.replace("...,", "Ellipsis,"))
        except SyntaxError:
            tree = None
        out += [
            (ast.unparse(node), node)
            for node in (ast.walk(tree) if tree else ())
            if isinstance(node, ast.Call) and not (prose and not node.args and not node.keywords)
        ]
    return out


def named_methods() -> list[str]:
    """The methods the prose names with empty parentheses (`llm.generate()`)."""
    return [span[:-2] for span in inline_code() if re.fullmatch(r"\w+(\.\w+)+\(\)", span)]


def test_every_name_the_doc_says_engine_exports_is_exported():
    import engine

    sentence = re.search(r"`engine` exports (.*?)\. Bad", TEXT, flags=re.S).group(1)
    exported = re.findall(r"`(\w+)`", sentence)
    assert len(exported) >= 10
    for name in exported:
        assert name in engine.__all__, name
        assert getattr(engine, name) is not None


def test_every_import_the_doc_shows_runs():
    imports = [
        node
        for code in example_code()
        for node in ast.walk(ast.parse(code))
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert imports
    for node in imports:
        exec(compile(ast.Module([node], []), "<docs/api.md>", "exec"), {})


def test_every_class_the_doc_names_resolves():
    names, checked = namespace(), 0
    for span in inline_code():
        try:
            tree = None if "/" in span else ast.parse(span.replace("...,", "Ellipsis,"))  # a path is no code
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            # a class or a constant: a capital and one more letter at least (K and N are the notation's)
            if isinstance(node, ast.Name) and node.id[0].isupper() and len(node.id) > 1:
                assert node.id in names, f"`{span}`: {node.id} is neither engine's export nor in a module named"
                checked += 1
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                assert hasattr(names[node.value.id], node.attr), f"`{span}`: {node.value.id} has no {node.attr}"
    assert checked >= 10


def check_call(source: str, call: ast.Call, names: dict) -> None:
    """Bind the call to the signature of what it calls (TypeError where it no longer fits); build the settings'
    dataclasses with the documented values (ValueError where one is refused)."""
    if isinstance(call.func, ast.Name) and call.func.id not in names:
        raise NameError(f"{source}: {call.func.id} is not a name the doc's reader has")
    signature = callee(call.func, names)
    if signature is None:
        raise NameError(f"{source}: a call of something neither the doc nor the engine defines")
    args = [value(a, names) for a in call.args if not isinstance(a, ast.Starred)]
    kwargs = {k.arg: value(k.value, names) for k in call.keywords if k.arg is not None}
    signature.bind(*args, **kwargs)
    if (
        isinstance(call.func, ast.Name)
        and call.func.id in BUILT
        and not any(isinstance(v, Placeholder) for v in [*args, *kwargs.values()])
    ):
        names[call.func.id](*args, **kwargs)


CALLS = calls()


@pytest.mark.parametrize("source, call", CALLS, ids=[source[:60] for source, _ in CALLS])
def test_every_documented_call_fits_the_signature_of_what_it_calls(source, call):
    check_call(source, call, namespace())


def test_every_attribute_the_example_reads_exists():
    """`o.text`, `o.finish_reason`, `chunk.text`: fields of what the example's variables hold."""
    read = [
        node
        for code in example_code()
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Attribute) and receiver(node.value) is not None
    ]
    assert len(read) >= 3
    for node in read:
        cls = receiver(node.value)
        fields = getattr(cls, "__dataclass_fields__", {})
        assert node.attr in fields or hasattr(cls, node.attr), ast.unparse(node)


def test_every_method_the_prose_names_exists():
    methods = named_methods()
    assert "llm.generate" in methods
    for name in methods:
        owner, _, method = name.rpartition(".")
        cls = receiver(ast.parse(owner, mode="eval").body)
        assert cls is not None and hasattr(cls, method), f"`{name}()`"


def test_every_keyword_the_doc_shows_alone_is_an_argument_of_the_api():
    """`chat_template=False`, `logprobs_mode=LogprobsMode.RAW`, `seed=None`, ...: an argument of LLM,
    SamplingParams or one of the settings' dataclasses."""
    from engine.config import REMOVED_QUANT_ARGUMENTS  # still taken, with a warning (the doc's table of them)

    names = namespace()
    takers = [names[n] for n in ("LLM", "SamplingParams", "SpeculativeConfig", "QuantConfig", "CompileConfig")]
    keywords = [m.group(1) for span in inline_code() if (m := re.fullmatch(r"(\w+)=.+", span))]
    assert keywords
    for keyword in keywords:
        assert any(keyword in inspect.signature(t).parameters for t in takers) or keyword in REMOVED_QUANT_ARGUMENTS, (
            keyword
        )


def test_the_calls_cover_the_example():
    sources = [source for source, _ in calls()]
    for expected in (
        "LLM(",
        "llm.generate(",
        "llm.stream(",
        "SamplingParams(",
        "SpeculativeConfig(",
        "out.metrics.write_rounds(",
    ):
        assert any(s.startswith(expected) for s in sources), expected


@pytest.mark.parametrize(
    "old, new, call, error",
    [
        ("top_p=0.9", "top_pp=0.9", "SamplingParams(", TypeError),  # a keyword the API does not take
        ("SpeculativeConfig(K=4)", "SpeculativeConfig(K=0)", "SpeculativeConfig(", ValueError),  # a refused value
        ("llm.stream(", "llm.streams(", "llm.streams(", NameError),  # a method the API does not have
    ],
    ids=["renamed keyword", "refused value", "missing method"],
)
def test_a_call_that_no_longer_fits_is_caught(old, new, call, error):
    """The negative control: the same checks on the example with one thing changed."""
    assert old in TEXT
    names = namespace()
    original = {source for source, _ in CALLS}
    changed = [(s, c) for s, c in calls(TEXT.replace(old, new)) if s.startswith(call) and s not in original]
    assert changed
    with pytest.raises(error):
        for source, call in changed:
            check_call(source, call, names)
