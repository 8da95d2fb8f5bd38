"""The architecture as the code shows it (docs/architecture.md): no import circles, the library
never imports its adapters, and the submitting side never loads torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str) -> set[str]:
    """Modules this file imports at run time (TYPE_CHECKING blocks excluded), made absolute."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def import_graph(*roots: str) -> dict[str, set[str]]:
    files = [p for r in roots for p in (REPO / r).rglob("*.py")]
    names = {_module_name(p): p for p in files}
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in _imports(path, package) if m in names and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    assert cycles(import_graph("arrcoc", "worker", "demo")) == []


def test_the_library_never_imports_its_adapters() -> None:
    """arrcoc/ (but its CLI, the entry point that starts them) never imports worker/ or demo/;
    nothing in the library imports the CLI."""
    graph = import_graph("arrcoc", "worker", "demo")
    for module, deps in graph.items():
        if module.startswith("arrcoc.") and module.split(".")[1] not in ("cli", "__main__"):
            bad = {
                d
                for d in deps
                if d.split(".")[0] in ("worker", "demo") or d.split(".")[:2] == ["arrcoc", "cli"]
            }
            assert not bad, f"{module} imports {bad}"


def test_the_submitting_side_loads_no_engine() -> None:
    """The request checks and the Celery executor (what the demo and `arrcoc submit` use to send
    work) import without torch: a web process never loads the engine to check a request."""
    code = (
        "import sys, arrcoc, arrcoc.request, arrcoc.service.client.celery_executor, arrcoc.service.codec\n"
        "from arrcoc.request import check_image_header, validate_query, Controls\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'arrcoc.pipeline', 'arrcoc.engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_import_arrcoc_is_light_and_exposes_the_api() -> None:
    code = (
        "import sys, arrcoc\n"
        "assert 'torch' not in sys.modules\n"
        "names = ['create_model', 'list_variants', 'texture_array', 'RelevancePipeline', 'Controls',"
        " 'RelevanceResult', 'create_executor', 'ArrcocError']\n"
        "assert all(callable(getattr(arrcoc, n)) for n in names)\n"
        "print(arrcoc.list_variants()[0], arrcoc.create_model('arrcoc-texture', None).variant_name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "arrcoc-texture"


def test_the_demo_submitting_through_celery_loads_no_torch() -> None:
    """The demo with a queue (ARRCOC_SERVICE__BROKER_URL) builds its page and imports every module of its
    own without torch: the model, its engine and torch live in the workers."""
    mods = sorted(_module_name(p) for p in (REPO / "demo").rglob("*.py"))
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "import demo.app\n"
        "demo.app.build_demo()\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'arrcoc.pipeline', 'arrcoc.engine') if m in sys.modules))"
    )
    env = {**os.environ, "ARRCOC_SERVICE__BROKER_URL": "redis://127.0.0.1:6379/13", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_variant_catalogue_reads_without_torch() -> None:
    code = (
        "import sys\n"
        "from arrcoc.registry import list_variants, get_variant, default_weights_path\n"
        "print(all(get_variant(n).grid > 0 for n in list_variants()), default_weights_path('arrcoc-texture').name,"
        " 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "arrcoc-texture.safetensors", "False"]
