"""The package installs into megatron-core's namespace without hiding it."""
import ast
import importlib
import pathlib


def test_namespace_keeps_megatron_core_importable():
    core = importlib.import_module("megatron.core")
    quant = importlib.import_module("megatron.quant")
    assert hasattr(core, "parallel_state")
    assert quant.__version__
    repo = pathlib.Path(__file__).resolve().parents[1]
    assert not (repo / "megatron" / "__init__.py").exists()


# The package's layers, bottom first: a module imports only from its own room or from a room
# below it (the package map in README.md). ``cpu`` patches megatron-core and imports nothing of ours.
LAYERS = (("cpu",), ("formats",), ("stats",), ("kernels",), ("recipes",), ("capture",), ("tensor_saver",), ("layers",), ("analysis",),
          ("training",), ("compare",))
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}
PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "megatron" / "quant"


def _module_name(path: pathlib.Path) -> str:
    parts = ("megatron", "quant") + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(node: ast.AST):
    """``node`` and everything under it, less ``if TYPE_CHECKING:`` blocks (never run)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not (isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING"):
            yield from _runtime_nodes(child)


def _imports(path: pathlib.Path) -> set[str]:
    """Every megatron.quant module ``path`` imports when run, at the top or inside a function."""
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("megatron.quant"):
            found |= ({f"{node.module}.{a.name}" for a in node.names} if node.module == "megatron.quant"
                      else {node.module})
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("megatron.quant")}
    return found


def _room(module: str) -> str:
    return module.split(".")[2] if module.count(".") >= 2 else ""


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def test_every_room_has_a_layer():
    rooms = {_room(module) for module in _graph()} - {""}
    assert rooms == set(RANK), "a new room (or a loose module) needs its place in LAYERS and the README map"


def test_no_module_imports_from_a_higher_room():
    upward = sorted(f"{module} -> {target}" for module, targets in _graph().items() for target in targets
                    if _room(module) and RANK[_room(target)] > RANK[_room(module)])
    assert not upward


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            target = target if target in graph else target.rsplit(".", 1)[0]  # "from pkg import name"
            assert state.get(target) != 1, " -> ".join(path + [module, target])
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
