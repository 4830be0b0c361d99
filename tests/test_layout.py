"""profiling/'s layout: the import contracts of pyproject.toml (the profile's stages, the two wings, no torch where a
trace is read) hold, only the CLI, the runner and the API import the wings, and the package's imports have no cycle
(read from the source, so a lazy import inside a function counts too)."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINGS = ("profiling.profile", "profiling.research")


def imports():
    """{module: set of profiling modules it imports}, for every module under profiling/."""
    graph = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "profiling")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            found = set()
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("profiling"):
                    for alias in node.names:  # `from profiling.profile.report import summary` imports a module
                        sub = f"{node.module}.{alias.name}"
                        found.add(sub if os.path.exists(os.path.join(ROOT, *sub.split(".")) + ".py")
                                  else node.module)
                elif isinstance(node, ast.Import):
                    found |= {a.name for a in node.names if a.name.startswith("profiling")}
            graph[module] = found - {module}
    return graph


def wing(module):
    return next((w for w in WINGS if module == w or module.startswith(w + ".")), None)


def test_import_contracts_hold():
    """import-linter's contracts (pyproject.toml [tool.importlinter]): report > findings > tables > trace, the
    capture apart, no torch where a trace is read, the wings independent."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_only_the_top_imports_the_wings():
    graph = imports()
    assert {wing(m) for m in graph} == {None, *WINGS}
    # the shared top may be imported by both wings; only the CLI, train.py's runner and the public profiling
    # API (profiling.Profiler: the profile wing's front door) import the wings
    importers = {m for m, deps in graph.items() if wing(m) is None and any(wing(i) for i in deps)}
    assert importers == {"profiling.cli", "profiling.runner", "profiling.api"}


def test_no_import_cycle():
    graph = imports()
    done, path = set(), []

    def visit(m):
        assert m not in path, " -> ".join(path[path.index(m):] + [m])
        if m in done:
            return
        path.append(m)
        for i in sorted(graph.get(m, ())):
            visit(i)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_top_level_stays_small():
    top = [n for n in os.listdir(os.path.join(ROOT, "profiling")) if n.endswith(".py")]
    assert len(top) <= 9, sorted(top)  # 8, and callbacks.py: the framework callbacks beside api (issue #41)
