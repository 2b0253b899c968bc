"""The code's layout stays readable: a module over about 400 lines says at its top why it is
one module."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 420  # "about 400"
REASON = "Why one module over 400 lines:"


def test_every_long_module_says_why_it_is_one():
    unexplained = []
    for package in ("testbed", "traffic", "controllers"):
        for path in sorted(glob.glob(os.path.join(ROOT, package, "*.py"))):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text.count("\n") > LIMIT and REASON not in (ast.get_docstring(ast.parse(text))
                                                          or ""):
                unexplained.append(f"{os.path.relpath(path, ROOT)}: {text.count(chr(10))} lines")
    assert not unexplained, "\n".join(unexplained)

