"""The package's structure, drawn from its code's imports (in the spirit of tests/test_trl_guard.py): dependencies
between trl_mintrl's modules run one way (no circle, lazy imports included), nothing private crosses a module
border (an imported name, or another module's private attribute reached on an object), no function is over 60
lines, and a module over 500 lines is one concern, named in LONG_MODULES. benchmarks/ is a library, tasks and
studies, by folder: imports run one way between them, no module is over 500 lines, and nothing edits sys.path. No
file cites a design document or an issue tracker the repository does not hold."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "trl_mintrl"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
# module -> the one concern that makes it long
LONG_MODULES = {
    "trl_mintrl.engines.vllm": "TRL's two vLLM modes behind the engine interface: the colocated engine and the server "
    "client, which share the collectives, the weight-sync context and the sampling settings",
    "trl_mintrl.mintrl.config": "MInTRL's configuration: its fields with their help texts, the docstring users read "
    "(every field documented: tests/test_docs.py), and each field's checks",
}
# private module names another module may import from: a leaf holding only `__version__`, the conventional name
PRIVATE_MODULES_ALLOWED = {"trl_mintrl._version"}
BENCHMARKS = REPO / "benchmarks"
# benchmarks/'s three layers, each importing only from its own layer or those before it: the shared library, the
# tasks (each importing only itself and the library), the studies (each importing no other study)
LAYERS = ("benchmarks.lib", "benchmarks.tasks", "benchmarks.studies")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Package:
    """Modules by dotted name: their parsed source and whether each is a package's `__init__` (`prefix`: the
    top-level package whose imports count)."""

    def __init__(self, sources: dict[str, tuple[str, bool]], prefix: str = "trl_mintrl"):
        self.trees = {name: ast.parse(source) for name, (source, _) in sources.items()}
        self.is_init = {name: is_init for name, (_, is_init) in sources.items()}
        self.prefix = prefix

    @classmethod
    def of(cls, root: Path) -> Package:
        sources = {module_name(p): (p.read_text(), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))}
        return cls(sources, prefix=root.name)

    def imports(self, module: str) -> list[tuple[str, str | None, int]]:
        """(imported module, imported name or None, line) of every import of a `prefix` module in `module`, lazy
        ones (inside functions) included; `from package import submodule` names the submodule."""
        package = module if self.is_init[module] else module.rpartition(".")[0]
        found = []
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                found += [(a.name, None, node.lineno) for a in node.names if _under(a.name, self.prefix)]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not _under(target, self.prefix):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub, None, node.lineno) if sub in self.trees else (target, alias.name, node.lineno))
        return found

    def import_graph(self) -> dict[str, set[str]]:
        return {m: {target for target, _, _ in self.imports(m) if target in self.trees} for m in self.trees}

    def private_imports(self) -> list[str]:
        problems = []
        for module in self.trees:
            for target, name, line in self.imports(module):
                if target == module:
                    continue
                if any(is_private(part) for part in target.split(".")) and target not in PRIVATE_MODULES_ALLOWED:
                    problems.append(f"{module}:{line} imports the private module {target}")
                if name is not None and is_private(name):
                    problems.append(f"{module}:{line} imports the private name {name} from {target}")
        return problems

    def private_members_defined(self) -> dict[str, set[str]]:
        """private method or attribute name -> the modules that define it (a `def _x` in a class, or an assignment
        to `self._x`)."""
        defined: dict[str, set[str]] = {}
        for module, module_tree in self.trees.items():
            for node in ast.walk(module_tree):
                names = []
                if isinstance(node, ast.ClassDef):
                    names = [i.name for i in node.body if isinstance(i, ast.FunctionDef | ast.AsyncFunctionDef)]
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
                    names = [node.attr]
                for name in filter(is_private, names):
                    defined.setdefault(name, set()).add(module)
        return defined

    def private_members_reached(self, seams: frozenset[str] = frozenset()) -> list[str]:
        """`obj._x` where `obj` is not `self`, `cls` or `super()` and `_x` is a private member that only other
        modules of the package define: one module reaching into another's internals. `seams`: private members of
        TRL's trainers that the package wraps on purpose (pinned in tests/test_trl_guard.py), not its own."""
        defined, problems = self.private_members_defined(), []
        for module, module_tree in self.trees.items():
            for node in ast.walk(module_tree):
                if not isinstance(node, ast.Attribute) or not is_private(node.attr):
                    continue
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                definers = defined.get(node.attr, set())
                if definers and module not in definers and node.attr not in seams:
                    problems.append(f"{module}:{node.lineno} reaches {node.attr} of {', '.join(sorted(definers))}")
        return problems

    def long_functions(self) -> list[str]:
        found = []
        for module, module_tree in self.trees.items():
            for node in ast.walk(module_tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{module}:{node.lineno} {node.name} has {lines} lines")
        return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


@cache
def trl_seams() -> frozenset[str]:
    """The private methods and attributes of TRL's `GRPOTrainer` and its bases (transformers' `Trainer`): what
    the trainers wrap on purpose, pinned in tests/test_trl_guard.py."""
    import inspect

    from trl import GRPOTrainer

    names = {name for name in dir(GRPOTrainer) if is_private(name)}
    for klass in GRPOTrainer.__mro__[:-1]:
        source_tree = ast.parse(inspect.getsource(inspect.getmodule(klass)))
        names |= {n.attr for n in ast.walk(source_tree) if isinstance(n, ast.Attribute) and _on_self(n)}
    return frozenset(filter(is_private, names))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def package() -> Package:
    return Package.of(PACKAGE)


@cache
def benchmarks() -> Package:
    return Package.of(BENCHMARKS)


def test_module_dependencies_run_one_way():
    found = circles(package().import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_nothing_private_crosses_a_module_border():
    problems = package().private_imports() + package().private_members_reached(trl_seams())
    assert not problems, "\n".join(problems)


def test_no_function_is_over_60_lines():
    found = package().long_functions()
    assert not found, "\n".join(found)


def test_a_module_over_500_lines_is_one_named_concern():
    lines = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {m: n for m, n in lines.items() if n > MAX_MODULE_LINES}
    unnamed = sorted(set(long) - set(LONG_MODULES))
    assert not unnamed, (
        f"modules over {MAX_MODULE_LINES} lines without a named concern: {[(m, long[m]) for m in unnamed]}"
    )
    stale = sorted(set(LONG_MODULES) - set(long))
    assert not stale, f"LONG_MODULES names modules no longer over {MAX_MODULE_LINES} lines: {stale}"


def test_the_checks_see_a_circle_a_private_import_a_private_reach_and_a_long_function():
    """Broken on purpose, on a made-up package: each check reports what it is for, and only that."""
    body = "    x = 1\n" * MAX_FUNCTION_LINES
    made_up = Package(
        {
            "trl_mintrl": ("", True),
            "trl_mintrl.a": ("from .b import _helper, public\n", False),
            "trl_mintrl.b": (
                "from . import c\n_helper = 1\npublic = 2\nclass B:\n    def _internal(self):\n        pass\n",
                False,
            ),
            "trl_mintrl.c": ("from .a import public\ndef reach(b):\n    return b._internal()\n", False),
            "trl_mintrl.d": (f"def long():\n{body}def short():\n    return 1\n", False),
        }
    )
    assert circles(made_up.import_graph()) == [["trl_mintrl.a", "trl_mintrl.b", "trl_mintrl.c"]]
    assert made_up.private_imports() == ["trl_mintrl.a:1 imports the private name _helper from trl_mintrl.b"]
    assert made_up.private_members_reached() == ["trl_mintrl.c:3 reaches _internal of trl_mintrl.b"]
    assert made_up.long_functions() == [f"trl_mintrl.d:1 long has {MAX_FUNCTION_LINES + 1} lines"]


def test_benchmark_imports_run_one_way():
    """No circle among benchmarks/'s modules, lazy imports (inside functions) included: the studies import the tasks
    and the library, never the other way round."""
    found = circles(benchmarks().import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def benchmark_unit(module: str) -> tuple[int, str] | None:
    """(layer, unit) of a benchmarks module: its layer's index in LAYERS and what it belongs to inside it (the library
    as a whole, one task, one study); None for the `benchmarks` package itself."""
    for layer, prefix in enumerate(LAYERS):
        if _under(module, prefix):
            rest = module[len(prefix) + 1 :].split(".")
            return layer, prefix if layer == 0 or not rest[0] else f"{prefix}.{rest[0]}"
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, imported in graph.items():
        unit = benchmark_unit(module)
        if unit is None:
            problems += [f"{module} is outside {', '.join(LAYERS)}"] if module != "benchmarks" else []
            continue
        for target in imported:
            other = benchmark_unit(target)
            if other is None or other[1] == unit[1] or other[0] < unit[0]:
                continue
            problems.append(f"{module} imports {target}")
    return sorted(problems)


def test_benchmarks_are_a_library_tasks_and_studies():
    """Every module sits in benchmarks/lib, benchmarks/tasks/<task> or benchmarks/studies; the library imports no
    task or study, a task no other task or study, a study no other study (what two studies share is the library's
    or a task's)."""
    problems = layer_violations(benchmarks().import_graph())
    assert not problems, "\n".join(problems)


def test_the_layer_check_sees_each_wrong_import():
    """Broken on purpose: a library module importing a task, a task importing the other task and a study importing
    another study are each reported; a study importing a task and the library is not."""
    graph = {
        "benchmarks": set(),
        "benchmarks.lib.harness": {"benchmarks.tasks.toy.task"},
        "benchmarks.tasks.toy.task": {"benchmarks.tasks.real.judge", "benchmarks.lib.stats"},
        "benchmarks.tasks.real.judge": set(),
        "benchmarks.studies.cost": {"benchmarks.studies.learning", "benchmarks.tasks.toy.task", "benchmarks.lib"},
        "benchmarks.studies.learning": {"benchmarks.tasks.toy.task", "benchmarks.lib.harness"},
        "benchmarks.stray": set(),
    }
    assert layer_violations(graph) == [
        "benchmarks.lib.harness imports benchmarks.tasks.toy.task",
        "benchmarks.stray is outside benchmarks.lib, benchmarks.tasks, benchmarks.studies",
        "benchmarks.studies.cost imports benchmarks.studies.learning",
        "benchmarks.tasks.toy.task imports benchmarks.tasks.real.judge",
    ]


def test_no_benchmark_module_is_over_500_lines():
    lines = {module_name(p): len(p.read_text().splitlines()) for p in BENCHMARKS.rglob("*.py")}
    long = sorted((m, n) for m, n in lines.items() if n > MAX_MODULE_LINES)
    assert not long, f"benchmark modules over {MAX_MODULE_LINES} lines: {long}"


def sys_path_edits(source: str) -> list[int]:
    """Lines that change `sys.path` (a call on it, an assignment to it or to an item of it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets), None)
        if isinstance(target, ast.Attribute) and target.attr == "path" and getattr(target.value, "id", "") == "sys":
            found.append(node.lineno)
    return sorted(found)


def test_studies_and_scripts_run_as_modules_without_editing_sys_path():
    edits = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in ("benchmarks", "scripts")
        for path in sorted((REPO / folder).rglob("*.py"))
        for line in sys_path_edits(path.read_text())
    ]
    assert not edits, f"sys.path edited (run the file with python -m from the repository root instead): {edits}"
    assert sys_path_edits("import sys\nsys.path.insert(0, 'x')\nsys.path = []\nsys.path[0] = 'y'\n") == [2, 3, 4]


def test_the_benchmark_checks_see_a_lazy_circle():
    """A study and a toy module importing each other inside functions (the circle learning.py and
    toy/learned_judge.py had) is found."""
    made_up = Package(
        {
            "benchmarks": ("", True),
            "benchmarks.tasks.toy": ("", True),
            "benchmarks.study": ("def run():\n    from benchmarks.tasks.toy.judge import fields\n", False),
            "benchmarks.tasks.toy.judge": ("def excluded():\n    from benchmarks.study import SEED\n", False),
        },
        prefix="benchmarks",
    )
    assert circles(made_up.import_graph()) == [["benchmarks.study", "benchmarks.tasks.toy.judge"]]


def package_names_imported(folders: tuple[str, ...] = ("benchmarks", "scripts")) -> dict[str, set[str]]:
    """trl_mintrl module -> the names the files under `folders` import from it, lazy imports included."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and _under(node.module or "", "trl_mintrl"):
                    found.setdefault(node.module, set()).update(alias.name for alias in node.names)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if _under(alias.name, "trl_mintrl"):
                            found.setdefault(alias.name, set()).add("(the module)")
    return found


def documented_seams() -> dict[str, set[str]]:
    """The table of docs/development.md that lists what the benchmarks use of the package."""
    text = (REPO / "docs" / "development.md").read_text()
    table = text.split("The benchmarks reach the package only through", 1)[1].split("\n\n")[1]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {module.strip(" `"): set(re.findall(r"`([^`]+)`", names)) for module, names in rows}


def test_the_benchmarks_reach_the_package_through_the_documented_names_only():
    """What the studies and scripts import of trl_mintrl is the table in docs/development.md, and nothing private: a
    change to those modules or names is a change a maintainer sees listed in one place."""
    imported = package_names_imported()
    assert imported == documented_seams(), "update the table in docs/development.md (or the imports)"
    private = sorted(
        f"{m}.{n}"
        for m, names in imported.items()
        for n in names
        if any(map(is_private, m.split("."))) or is_private(n)
    )
    assert not private, private


def tracked_text_files() -> list[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [
        path
        for path in tracked
        if path.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt")) or path.startswith(".ci/")
        if (REPO / path).is_file()
    ]


# the design document the project started from, and a tracker's issue number (the word, then a number): spelt in
# pieces here, so that this file does not cite them
UNOPENABLE = {
    "the design document": re.compile(r"\b" + "SP" + r"EC\b"),
    "an issue number": re.compile(r"\b" + "[Ii]ss" + r"ues?\s+#?\d+"),
}


def test_no_file_cites_what_a_reader_cannot_open():
    """A reader has neither the design document the project started from nor its issue tracker: code, docs and
    results say the thing itself, or link a docs page."""
    citing = [
        f"{path} cites {what}"
        for path in tracked_text_files()
        for what, pattern in UNOPENABLE.items()
        if pattern.search((REPO / path).read_text(errors="ignore"))
    ]
    assert not citing, citing
    assert UNOPENABLE["an issue number"].search("as " + "iss" + "ue 46 found")


def test_mintrl_trainer_reaches_grpo_trainer_through_at_most_two_classes():
    """Following `train`, `_score_batch` or `_compute_loss` from `MInTRLTrainer` passes at most two classes before TRL's
    own: the schedule, the judge's watch and the model card are parts or functions, not bases."""
    from trl import GRPOTrainer

    from trl_mintrl import MInTRLTrainer

    between = MInTRLTrainer.__mro__[1 : MInTRLTrainer.__mro__.index(GRPOTrainer)]
    assert len(between) <= 2, [c.__name__ for c in between]
