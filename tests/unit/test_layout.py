"""The code's layout stays readable: a module over about 400 lines says at its top why it is
one module."""
import ast
import glob
import os
import re

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
LAYERS = ["base", "job", "scenario", "plan", "fabric", "switchq", "results", "run", "validate"]


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


def layout_sections(design_text):
    """DESIGN.md's layout block as {directory: the text that describes it} ("testbed/",
    "testbed/results/", "docs/", ...): a line starting a word that ends with / opens one."""
    block = design_text.split("## Layout", 1)[1].split("```", 2)[1]
    sections, top, current = {}, "", None
    for line in block.splitlines():
        m = re.match(r"^( {0,2})([\w.-]+/)(.*)", line)
        if m:
            current = (top if m.group(1) else "") + m.group(2)
            top = top if m.group(1) else m.group(2)
            line = m.group(3)
        if current:
            sections[current] = sections.get(current, "") + " " + line
    return sections


def test_the_design_layout_names_every_module_and_doc():
    with open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8") as f:
        sections = layout_sections(f.read())
    missing = []
    for folder, pattern in (("testbed/", "*.py"), ("controllers/", "*.py"), ("traffic/", "*.py"),
                            ("traffic/", "*.c"), ("benchmarks/", "*.py"), ("docs/", "*.md")):
        dirs = [folder] + ([f"{folder}{d}/" for d in LAYERS] if folder == "testbed/" else [])
        for d in dirs:
            words = set(re.findall(r"[\w.-]+", sections.get(d, "")))
            for path in sorted(glob.glob(os.path.join(ROOT, d, pattern))):
                name = os.path.basename(path)
                if name != "__init__.py" and name not in words and name[:-3] not in words:
                    missing.append(os.path.join(d, name))
    assert not missing, "not in docs/DESIGN.md's layout: " + ", ".join(missing)
