"""The package's layers, checked from its imports: no module imports one from a higher layer,
and no two modules import each other, directly or around a cycle.

Every import counts, at module level or inside a function, read with ``ast`` (nothing is
imported). The layers, lowest first, are the drawing in docs/architecture.md.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gradsync"

LAYERS = [   # lowest first; a module may import its own layer and those below it
    ("base", ["gradsync.errors", "gradsync.units", "gradsync.dtypes"]),
    ("coding", ["gradsync.coding"]),
    ("data model", ["gradsync.core", "gradsync.algorithms", "gradsync.compression"]),
    ("models of time", ["gradsync.model"]),
    ("transports", ["gradsync.runtime.transport", "gradsync.runtime.state"]),
    ("runtime", ["gradsync.runtime"]),
    ("integrations and tools", ["gradsync.integrations", "gradsync.tools", "gradsync.distributed"]),
    ("applications", ["gradsync.training", "gradsync.web", "gradsync.cli", "gradsync.torch", "gradsync.__main__"]),
    ("front door", ["gradsync"]),
]


def module_files() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules) -> set[str]:
    """The gradsync modules that ``name`` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def layer_of(name: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{name} is in no layer: add it to LAYERS and to docs/architecture.md"
    return rank


GRAPH = {name: imports_of(name, path, module_files()) for name, path in module_files().items()}


def test_every_module_has_a_layer():
    for name in GRAPH:
        layer_of(name)


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_no_import_climbs_to_a_higher_layer(name):
    climbs = [f"{dep} ({LAYERS[layer_of(dep)][0]})" for dep in sorted(GRAPH[name]) if layer_of(dep) > layer_of(name)]
    assert not climbs, f"{name} ({LAYERS[layer_of(name)][0]}) imports from a higher layer: {', '.join(climbs)}"


def test_no_import_cycles():
    # a package's __init__ re-exporting its submodules is not a cycle with them
    graph = {n: {d for d in deps if not n.startswith(d + ".")} for n, deps in GRAPH.items()}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


MODULE_LINES, FUNCTION_LINES = 400, 60


def too_big(path: Path) -> list[str]:
    """What in ``path`` is too long to read in one sitting: the module, or any function."""
    text = path.read_text()
    out = [f"{path.name}: {len(text.splitlines())} lines"] if len(text.splitlines()) > MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
            out.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    return out


def test_every_room_is_small_enough_to_read():
    # the web page's script (web/static/) is not Python and not counted
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in too_big(path)]
    assert not found, f"over {MODULE_LINES} lines a module or {FUNCTION_LINES} a function: " + "; ".join(found)


def test_the_size_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    assert too_big(tmp_path / "long.py") == [f"long.py:1 long: {FUNCTION_LINES + 1} lines"]


def test_the_checker_sees_a_climb_and_a_cycle(tmp_path):
    # the check itself can fail: a transport importing the api climbs, and api <-> collective is a cycle
    assert layer_of("gradsync.runtime.api") > layer_of("gradsync.runtime.transport.shm")
    assert layer_of("gradsync.tools.launch") > layer_of("gradsync.runtime.api")
    fake = tmp_path / "api.py"
    fake.write_text("from .collective import x\nfrom ..core import plan\n")
    assert imports_of("gradsync.runtime.api", fake, module_files()) == {"gradsync.runtime.collective",
                                                                         "gradsync.core.plan"}


def test_all_reduce_reaches_the_wire_in_one_pass():
    # api -> communicator -> plans -> (request, transport, prepare) -> collective -> exact ->
    # transport, with no call back into the api: before the re-layout api.py was entered five times
    from runtime_bodies import path_to_the_wire

    from gradsync.tools.launch import run

    calls = run(path_to_the_wire, 2)[0]
    modules = [m for m, _ in calls]
    api_calls = [f for m, f in calls if m == "gradsync.runtime.api"]
    assert api_calls.count("all_reduce") == 1, f"api.py entered again on the way to the wire: {api_calls}"
    left_api = next(i for i, m in enumerate(modules) if m != "gradsync.runtime.api" and i > 0)
    assert "gradsync.runtime.api" not in modules[left_api:], f"a call back into api.py: {calls}"
    assert calls[-1][1] == "post" and modules[-1].startswith("gradsync.runtime.transport")
    first = {m: modules.index(m) for m in modules}
    assert first["gradsync.runtime.api"] < first["gradsync.runtime.communicator"] < first["gradsync.runtime.plans"] \
        < first["gradsync.runtime.prepare"] < first["gradsync.runtime.collective"] < first["gradsync.runtime.exact"], \
        first
