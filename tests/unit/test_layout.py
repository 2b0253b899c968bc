"""The code's layout stays readable: a module over about 400 lines says at its top why it is
one module."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 420  # "about 400"
REASON = "Why one module over 400 lines:"


PACKAGES = ("testbed", "traffic", "controllers", "benchmarks")


def unexplained_long_modules(root, packages=PACKAGES):
    """Every module of ``packages`` under ``root`` (subpackages included) over LIMIT lines
    whose docstring does not say why it is one module."""
    out = []
    for package in packages:
        for path in sorted(glob.glob(os.path.join(root, package, "**", "*.py"), recursive=True)):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text.count("\n") > LIMIT and REASON not in (ast.get_docstring(ast.parse(text))
                                                          or ""):
                out.append(f"{os.path.relpath(path, root)}: {text.count(chr(10))} lines")
    return out


def test_every_long_module_says_why_it_is_one():
    unexplained = unexplained_long_modules(ROOT)
    assert not unexplained, "\n".join(unexplained)


def test_the_guard_sees_a_long_module_deep_in_a_subpackage(tmp_path):
    deep = tmp_path / "testbed" / "results" / "more"
    deep.mkdir(parents=True)
    (deep / "long.py").write_text('"""A long module."""\n' + "x = 1\n" * 500)
    (deep / "explained.py").write_text(f'"""Long.\n\n{REASON} it is.\n"""\n' + "x = 1\n" * 500)
    (deep / "short.py").write_text("x = 1\n" * 400)
    assert unexplained_long_modules(str(tmp_path)) == [
        os.path.join("testbed", "results", "more", "long.py") + ": 501 lines"]


# testbed's subpackages along a run's data flow; a module imports its own layer and those
# before it, never one after it (the top-level modules may import all of them)
LAYERS = ["base", "job", "scenario", "fabric", "switchq", "results", "run", "validate"]


def imports_of(path):
    """Every module ``path`` imports, absolute, lazy imports inside functions included (not
    those for type annotations only, under ``if TYPE_CHECKING:``)."""
    package = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, ".")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    annotations_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                        and getattr(node.test, "id", None) == "TYPE_CHECKING"
                        for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            if not node.module:  # from . import a, b: modules of that package
                yield from (f"{module}.{a.name}" for a in node.names)


def layer(module):
    parts = module.split(".")
    if parts[0] != "testbed" or len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


def test_imports_run_one_way():
    wrong = []
    for package in ("controllers", "traffic"):
        for path in glob.glob(os.path.join(ROOT, package, "*.py")):
            wrong += [f"{os.path.relpath(path, ROOT)} imports {m}" for m in imports_of(path)
                      if m.startswith("testbed") and not m.startswith("testbed.base")]
    for path in glob.glob(os.path.join(ROOT, "testbed", "*", "*.py")):
        mine = layer(os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."))
        wrong += [f"{os.path.relpath(path, ROOT)} imports {m}" for m in imports_of(path)
                  if layer(m) is not None and layer(m) > mine]
    assert not wrong, "\n".join(sorted(wrong))
