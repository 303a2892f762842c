"""The import-layering contract, read from the code's own imports (no import is executed).

* ``core`` is pure: it imports only ``core`` and a short list of computational standard
  modules; no asyncio, aiohttp, HTTP client, clock, file system, process, socket or
  global randomness (a policy that needs them receives them as arguments).
* No cycles between the units of ``pearl_sglang`` (its subpackages and top-level modules),
  nor between its modules: the control plane's shell (``orchestrator``) composes the
  growth and the weight loads, which ask it for plans through a port, not an import; the
  state table's invariants live with the table. One known exception is listed in
  ``MODULE_CYCLES_KNOWN``: the emulated engine is one class split over mixin files.
* The control plane and the router do not import each other: the control plane reaches
  the data path through its ``DataPlane`` port, the router reads the control plane through
  ``ControlView``, and ``server`` composes the two.
* The emulator is a worker: it meets PEARL only over the worker protocol (HTTP), so it
  imports none of ``router``, ``control``, ``server`` or ``core``; what connects it to them
  in one process (the in-process transport, the emulator launcher) is harness.
* The worker protocol (``workers``: the client and its errors) is shared by the router
  and the control plane and imports neither, nor ``server``.
* Harnesses live outside the product: nothing in ``pearl_sglang`` imports ``benchmarks``
  or ``tests``.
* The shells take the clock: ``router``, ``control`` and ``server`` never import ``time``;
  they read time and sleep through an injected ``pearl_sglang.clock.Clock`` (or the event
  loop's, which a trace replay makes virtual).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: each is a
dependency of the design. A ``__main__`` module is a program that nothing imports, so its
imports are where a program is put together and are not layered.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pearl_sglang"

CORE_MAY_IMPORT = frozenset({
    "__future__", "abc", "bisect", "collections", "dataclasses", "enum", "functools", "heapq", "itertools",
    "math", "operator", "statistics", "typing",
})
NEVER_EACH_OTHER = ("control", "router")
TAKE_THE_CLOCK = ("control", "router", "server")
EMULATOR_NEVER_IMPORTS = frozenset({"router", "control", "server", "core"})
HARNESSES = ("benchmarks", "tests")
SHARED_BY_THE_SHELLS = {"workers": frozenset({"router", "control", "server"})}
# The emulated engine (a worker, not PEARL) mixes its control and PD halves into one class
# from their own files, typed against it; one-way, they would be parts it composes.
MODULE_CYCLES_KNOWN = [sorted(f"pearl_sglang.emulator.{m}" for m in ("control", "engine", "pd", "pd_side"))]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute names of what ``path`` imports, with their lines (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, node.lineno))
            # ``from pearl_sglang import router`` or ``from . import http_control`` imports
            # the submodule itself.
            found += [(f"{name}.{alias.name}", node.lineno) for alias in node.names
                      if _is_module(f"{name}.{alias.name}")]
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def _unit(module: str) -> str | None:
    """``pearl_sglang.router.app`` -> ``router``; ``pearl_sglang.clock`` -> ``clock``."""
    parts = module.split(".")
    if parts[0] != "pearl_sglang" or len(parts) < 2:
        return None
    return parts[1]


def _edges() -> dict[tuple[str, str], list[str]]:
    """Unit -> unit, with the file:line of each import that makes the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in _sources():
        src = _unit(_module_name(path))
        for name, line in _imports(path):
            dst = _unit(name)
            if src and dst and dst != src:
                edges.setdefault((src, dst), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def _cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_is_read_whole():
    # A guard for the rules below: they pass vacuously if nothing is found.
    units = {_unit(_module_name(p)) for p in _sources()}
    assert {"core", "control", "router"} <= units
    assert any(name.startswith("pearl_sglang.core") for name, _ in _imports(PACKAGE / "core" / "planner.py"))


def test_core_is_pure():
    offences = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for name, line in _imports(path):
            top = name.split(".")[0]
            if (top == "pearl_sglang" and _unit(name) == "core") or top in CORE_MAY_IMPORT:
                continue
            offences.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not offences, "core must stay free of I/O and of the shells:\n" + "\n".join(offences)


def test_no_cycles_between_units():
    edges = _edges()
    cycles = _cycles(edges)
    detail = [f"{' <-> '.join(c)}: " + "; ".join(f"{a} -> {b} at {', '.join(edges[a, b][:3])}"
                                                   for a in c for b in c if (a, b) in edges)
              for c in cycles]
    assert not cycles, "units of pearl_sglang import each other in a loop:\n" + "\n".join(detail)


def test_no_cycles_between_modules():
    edges: dict[tuple[str, str], list[str]] = {}
    for path in _sources():
        src = _module_name(path)
        for name, line in _imports(path):
            if name.startswith("pearl_sglang.") and name != src:
                edges.setdefault((src, name), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    cycles = [c for c in _cycles(edges) if c not in MODULE_CYCLES_KNOWN]
    assert not cycles, f"modules of pearl_sglang import each other in a loop: {cycles}"


def test_control_and_router_do_not_import_each_other():
    edges = _edges()
    a, b = NEVER_EACH_OTHER
    crossing = {f"{x} -> {y}": edges[x, y] for x, y in ((a, b), (b, a)) if (x, y) in edges}
    assert not crossing, f"{a} and {b} meet only in server (ports, not imports): {crossing}"


def test_the_emulator_knows_only_the_worker_protocol():
    crossing = {f"emulator -> {b}": where for (a, b), where in _edges().items()
                if a == "emulator" and b in EMULATOR_NEVER_IMPORTS}
    assert not crossing, f"the emulator imports PEARL's own code (a harness should join them): {crossing}"


def test_the_worker_protocol_is_below_both_shells():
    crossing = {f"{a} -> {b}": where for (a, b), where in _edges().items()
                if b in SHARED_BY_THE_SHELLS.get(a, ())}
    assert not crossing, f"the worker client is shared by router and control, so imports neither: {crossing}"


def test_the_product_does_not_import_its_harnesses():
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                for path in _sources() for name, line in _imports(path) if name.split(".")[0] in HARNESSES]
    assert not offences, "benchmarks and tests build on pearl_sglang, not the other way:\n" + "\n".join(offences)


def test_the_shells_take_the_clock():
    offences = []
    for unit in TAKE_THE_CLOCK:
        for path in sorted((PACKAGE / unit).rglob("*.py")):
            if path.name == "__main__.py":
                continue
            offences += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                         for name, line in _imports(path) if name == "time" or name.startswith("time.")]
    assert not offences, "read time through an injected Clock (pearl_sglang.clock):\n" + "\n".join(offences)
