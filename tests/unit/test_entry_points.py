"""Every ``python -m pearl_sglang.*`` entry point works with the base install (what
``pip install pearl-sglang`` brings) or names the extra to install.

The base install is rebuilt here without the network: an isolated interpreter (``-I -S``:
no site-packages, no PYTHONPATH) that sees the standard library, this repository, and the
installed distributions that ``install_requires`` pulls in (transitively) and nothing else.
A module that imports anything beyond that fails as it would after ``pip install .``.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXTRA_HINT = re.compile(r"pip install '?pearl-sglang\[(\w+)\]'?")


def _setup_lists() -> dict[str, list[str]]:
    """The requirement lists of setup.py, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    names: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            names[node.targets[0].id] = [ast.literal_eval(e) for e in node.value.elts]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup":
            for kw in node.keywords:
                if kw.arg == "install_requires":
                    names["install_requires"] = _resolve(kw.value, names)
                if kw.arg == "extras_require":
                    for k, v in zip(kw.value.keys, kw.value.values):
                        names[f"extra:{ast.literal_eval(k)}"] = _resolve(v, names)
    return names


def _resolve(node: ast.AST, names: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Name):
        return list(names[node.id])
    if isinstance(node, ast.BinOp):
        return _resolve(node.left, names) + _resolve(node.right, names)
    return [ast.literal_eval(e) for e in node.elts]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]


def _closure(requirements: list[str]) -> set[str]:
    """Installed distributions these requirements pull in, extras-only ones left out."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen.add(key)
        todo.extend(Requirement(r) for r in dist.requires or ())
    return seen


def _shadow_site(tmp: Path, dists: set[str]) -> Path:
    """A directory holding links to exactly these distributions' top-level modules."""
    site = tmp / "site"
    site.mkdir()
    for name in dists:
        dist = md.distribution(name)
        for f in dist.files or ():
            top = f.parts[0]
            if top.startswith("..") or top == "__pycache__" or top.endswith(".pth"):
                continue
            src = Path(dist.locate_file(top))
            dst = site / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return site


def entry_points() -> list[str]:
    mains = {".".join(p.relative_to(REPO).parent.parts) for p in (REPO / "pearl_sglang").rglob("__main__.py")}
    scripts = {".".join(p.relative_to(REPO).with_suffix("").parts)
               for p in (REPO / "pearl_sglang").rglob("*.py")
               if p.name != "__main__.py" and 'if __name__ == "__main__"' in p.read_text()}
    return sorted(mains | scripts)


@pytest.fixture(scope="module")
def base_site(tmp_path_factory) -> Path:
    return _shadow_site(tmp_path_factory.mktemp("base-install"), _closure(_setup_lists()["install_requires"]))


def _run(site: Path, module: str) -> subprocess.CompletedProcess:
    code = ("import runpy, sys; sys.path[:0] = [%r, %r]; sys.argv = [%r, '--help']; "
            "runpy.run_module(%r, run_name='__main__', alter_sys=True)" % (str(site), str(REPO), module, module))
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_entry_points_are_found():
    assert {"pearl_sglang.router", "pearl_sglang.emulator", "pearl_sglang.demo", "pearl_sglang.decide"} \
        <= set(entry_points())


@pytest.mark.parametrize("module", entry_points())
def test_entry_point_runs_on_the_base_install_or_names_its_extra(base_site, module):
    out = _run(base_site, module)
    if out.returncode == 0:
        assert "usage" in out.stdout.lower(), out.stdout
        return
    hint = EXTRA_HINT.search(out.stderr)
    assert hint, f"{module} failed on the base install without naming an extra:\n{out.stderr[-3000:]}"
    lists = _setup_lists()
    assert f"extra:{hint.group(1)}" in lists, f"{module} names an extra setup.py does not define: {hint.group(1)}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_the_shadow_install_really_lacks_optional_packages(base_site):
    """The check means something only if a module outside the base install fails there."""
    code = "import sys; sys.path[:0] = [%r]; import matplotlib" % str(base_site)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "No module named 'matplotlib'" in out.stderr


def test_demo_without_matplotlib_names_its_extra_before_running(base_site):
    code = ("import runpy, sys; sys.path[:0] = [%r, %r]; sys.argv = ['pearl_sglang.demo']; "
            "runpy.run_module('pearl_sglang.demo', run_name='__main__', alter_sys=True)"
            % (str(base_site), str(REPO)))
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert out.returncode == 2, out.stderr[-2000:]
    assert EXTRA_HINT.search(out.stderr).group(1) == "demo"
