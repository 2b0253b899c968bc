"""Every document the repository's files name resolves to a file in the repository: docs the
code cites live in the project, never beside it."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MD = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b")


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if f.endswith((".py", ".md", ".sh", ".yaml", ".cfg", ".c"))
            or os.path.basename(f) in ("Makefile", "Vagrantfile", "run")]


def resolves(ref: str, where: str, names: dict) -> bool:
    if "/" in ref:  # a path: from the repository's root, or from the file that names it
        paths = (os.path.normpath(os.path.join(base, ref))
                 for base in (ROOT, os.path.join(ROOT, os.path.dirname(where))))
        return any(p.startswith(ROOT + os.sep) and os.path.isfile(p) for p in paths)
    return len(names.get(ref, ())) == 1  # a bare name: exactly one such file


def test_every_named_document_is_a_file_of_the_repository():
    files = tracked()
    names: dict = {}
    for f in files:
        if f.endswith(".md"):
            names.setdefault(os.path.basename(f), []).append(f)
    missing = []
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as text:
            for n, line in enumerate(text, 1):
                missing += [f"{f}:{n}: {ref}" for ref in MD.findall(line)
                            if not resolves(ref, f, names)]
    assert not missing, "\n".join(missing)


def test_a_document_beside_the_repository_does_not_count():
    names = {"DESIGN.md": ["docs/DESIGN.md"]}
    assert resolves("docs/DESIGN.md", "testbed/x.py", names)
    assert resolves("DESIGN.md", "testbed/x.py", names)
    outside, unknown = "../shared/docs/DESIGN" + ".md", "STYLE" + ".md"  # not scanned
    assert not resolves(outside, "README.md", names)
    assert not resolves(unknown, "testbed/x.py", names)


def test_the_design_and_reference_documents_exist():
    for name in ("DESIGN.md", "REFERENCE.md"):
        assert os.path.getsize(os.path.join(ROOT, "docs", name)) > 2000
