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
# below it (the package map in README.md). ``cpu`` patches megatron-core and ``compat`` bridges its
# releases; ``notices`` keeps its known start-up notices off the commands' consoles; ``position`` (the
# run position) is read by the layers and the saver alike; ``yaml_safe`` reads every YAML (recipes,
# plans) with aliases bounded; ``output_dir`` checks a folder a command will write; ``settings`` is the
# vocabulary of settings (switch words, index selectors, the name rule) that recipes, capture and
# training share, and the one reader of the environment; only ``cpu`` imports one of the others (the
# launcher's rank, from ``settings``). ``lab`` (studies and sweeps of whole runs) sits on top: it drives
# the trainer and reads runs through analysis.
LAYERS = (("cpu", "compat", "notices", "position", "yaml_safe", "output_dir", "settings"), ("formats",), ("stats",),
          ("kernels",), ("recipes",), ("capture",), ("tensor_saver",), ("layers",), ("analysis",), ("training",),
          ("compare",), ("lab",))
# Rooms that a room must not import although they lie below it: the trainer trains and knows nothing
# of reports (analysis) or of the studies that drive it; a recipe is data (formats and options), and the
# layers choose the kernels that run it.
APART = {"training": {"analysis"}, "recipes": {"kernels"}}
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}
# Inside analysis: the kit both reports use (top-level modules), then the capture report and the runs
# comparison (independent of each other), then the command line that dispatches to them.
ANALYSIS_LAYERS = (("kit",), ("captures", "runs"), ("cli", "__main__"))
ANALYSIS_RANK = {room: rank for rank, rooms in enumerate(ANALYSIS_LAYERS) for room in rooms}
MAX_LINES = 400
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


def _absolute(path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` names, relative ones (``from .x import y``) resolved against ``path``."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    package = package if path.name == "__init__.py" else package[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: pathlib.Path) -> set[str]:
    """Every megatron.quant module ``path`` imports when run, at the top or inside a function, relative
    imports included: a name imported from a package is that submodule when one exists."""
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        module = _absolute(path, node) if isinstance(node, ast.ImportFrom) else ""
        if module.startswith("megatron.quant"):
            found |= {f"{module}.{a.name}" for a in node.names}  # _graph keeps the module where a name is no module
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("megatron.quant")}
    return found


def _room(module: str) -> str:
    return module.split(".")[2] if module.count(".") >= 2 else ""


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (a name imported from a package: that submodule, else the package)."""
    raw = {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}
    return {module: {t if t in raw else t.rsplit(".", 1)[0] for t in targets} for module, targets in raw.items()}


def test_every_room_has_a_layer():
    rooms = {_room(module) for module in _graph()} - {""}
    assert rooms == set(RANK), "a new room (or a loose module) needs its place in LAYERS and the README map"


def test_no_module_imports_from_a_higher_room():
    upward = sorted(f"{module} -> {target}" for module, targets in _graph().items() for target in targets
                    if _room(module) and RANK[_room(target)] > RANK[_room(module)])
    assert not upward


def test_apart_rooms_do_not_import_each_other():
    crossing = sorted(f"{module} -> {target}" for module, targets in _graph().items() for target in targets
                      if _room(target) in APART.get(_room(module), ()))
    assert not crossing


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            assert state.get(target) != 1, " -> ".join(path + [module, target])
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def _analysis_room(module: str) -> str:
    part = module.split(".")[3] if module.count(".") >= 3 else "kit"
    return part if part in ANALYSIS_RANK else "kit"


def test_analysis_kit_below_its_reports_and_cli_on_top():
    analysis = {module: targets for module, targets in _graph().items() if _room(module) == "analysis"}
    upward = sorted(f"{module} -> {target}" for module, targets in analysis.items() for target in targets
                    if _room(target) == "analysis"
                    and ANALYSIS_RANK[_analysis_room(target)] > ANALYSIS_RANK[_analysis_room(module)]
                    or {_analysis_room(module), _analysis_room(target)} == {"captures", "runs"})
    assert not upward


def test_relative_imports_are_counted():
    graph = _graph()
    assert "megatron.quant.kernels.launch" in graph["megatron.quant.kernels.blocks"]
    assert "megatron.quant.kernels.blocks" in graph["megatron.quant.kernels.triton_format"]  # from . import blocks


def test_no_module_imports_another_modules_private_names():
    """A leading underscore says the name is its module's own: what another module needs is public."""
    private = sorted(f"{_module_name(path)} imports {name}" for path in PACKAGE.rglob("*.py") for name in _imports(path)
                     if name.rsplit(".", 1)[1].startswith("_") and not name.rsplit(".", 1)[1].startswith("__"))
    assert not private, "make these public (no underscore) or keep them in their module"


def test_no_module_over_the_line_limit():
    long = sorted(f"{path.relative_to(PACKAGE)}: {n}" for path in PACKAGE.rglob("*.py")
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert not long, f"split these (one job per file, at most {MAX_LINES} lines)"


# capture/ holds tensor_saver's parts: the rest of the package goes through the facade, but for the
# reader of capture files, which needs the on-disk file-name contract (capture.naming), not a session.
CAPTURE_FILE_READERS = {"megatron.quant.analysis.captures.catalog": {"megatron.quant.capture.naming"}}
# stats/'s layout module is written by the kernels that take statistics in their pass; readers use the room.
STATS_LAYOUT_WRITERS = {"kernels"}


def test_capture_and_stats_are_reached_through_their_facades():
    graph = _graph()
    bypass = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                    if _room(target) == "capture" and _room(module) not in ("capture", "tensor_saver")
                    and target not in CAPTURE_FILE_READERS.get(module, ()))
    assert not bypass, "import megatron.quant.tensor_saver instead"
    inside = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                    if _room(target) == "stats" and target != "megatron.quant.stats"
                    and _room(module) not in {"stats", *STATS_LAYOUT_WRITERS})
    assert not inside, "import from megatron.quant.stats"
    layers = {target for module, targets in graph.items() if _room(module) == "layers" for target in targets}
    assert not {t for t in layers if _room(t) in ("capture", "stats")}, "the layers use tensor_saver only"


def _core_bindings(tree: ast.AST) -> dict[str, object]:
    """The local names a module binds to megatron-core modules, classes and functions, resolved."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megatron.core"):
            module = importlib.import_module(node.module)
            for a in node.names:
                value = getattr(module, a.name, None)
                bound[a.asname or a.name] = (importlib.import_module(f"{node.module}.{a.name}")
                                             if value is None else value)
        elif isinstance(node, ast.Import):
            bound |= {a.asname or a.name: importlib.import_module(a.name) for a in node.names
                      if a.name.startswith("megatron.core")}
    return bound


def _private_core_names(path: pathlib.Path) -> set[str]:
    """Private megatron-core names ``path`` uses: imported, read off a megatron-core module or class, or
    overridden or called through ``super()`` in a subclass of a megatron-core class (a private method
    of our own in such a subclass is ours)."""
    tree = ast.parse(path.read_text())
    bound, found = _core_bindings(tree), set()
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megatron.core"):
            found |= {a.name for a in node.names if private(a.name)}
        elif (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
              and node.value.id in bound and hasattr(bound[node.value.id], node.attr)):
            found.add(node.attr)
        elif isinstance(node, ast.ClassDef) and {getattr(b, "id", None) for b in node.bases} & set(bound):
            cls = getattr(importlib.import_module(_module_name(path)), node.name)
            core = [b for b in cls.__mro__ if b.__module__.startswith("megatron.core")]
            used = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call)
                     and getattr(n.value.func, "id", None) == "super"}
            found |= {name for name in used if private(name) and any(name in vars(b) for b in core)}
    return found


def test_private_megatron_core_names_are_listed_in_compat():
    from megatron.quant import compat

    listed = {entry.name.rsplit(".", 1)[-1] for entry in compat.PRIVATE_NAMES}
    unlisted = sorted(f"{path.relative_to(PACKAGE)}: {name}" for path in PACKAGE.rglob("*.py")
                      if path.name != "compat.py" for name in _private_core_names(path) - listed)
    assert not unlisted, "use a public name, or list it in compat.PRIVATE_NAMES with why"


def test_listed_private_names_exist_in_the_installed_megatron_core():
    from megatron.quant import compat

    missing = []
    for entry in compat.PRIVATE_NAMES:
        owner = importlib.import_module(entry.module)
        for part in entry.name.split("."):
            owner = getattr(owner, part, missing)
        if owner is missing:
            missing.append(f"{entry.module}.{entry.name}")
    assert not missing, f"gone from this megatron-core (checked on {compat.CHECKED_ON}): {missing}"
