"""The package's imports, walked from the source (every `import`, also the ones inside functions): no
circle and no import that goes up the layers written down in docs/design.md ("Layers"). Each module is
a node under the name it ships as (envs/ and algorithms/ as agentrl.envs and agentrl.algorithms), an
edge is an import of another agentrl module, a circle is a strongly connected component of more than one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def modules() -> dict[str, Path]:
    """Every module of the distribution, by the name it ships as (pyproject's package-dir)."""
    line = next(x for x in (ROOT / "pyproject.toml").read_text().splitlines() if x.startswith("package-dir"))
    package_dir = dict(re.findall(r'"([\w.]+)" = "(\w+)"', line))  # no tomllib on Python 3.10
    assert package_dir.get("agentrl.envs") == "envs", line
    out = {}
    for package, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            if not any(name.startswith(other + ".") or name == other
                       for other in package_dir if other != package and other.startswith(package + ".")):
                out[name] = path  # agentrl/envs/... would shadow envs/: the package-dir entry decides
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
    return out


def layers(text: str) -> dict[str, int]:
    """{module or package name: its layer} from the numbered lines of design.md's "Layers" section."""
    section = text.split("### Layers", 1)[1].split("\n#", 1)[0]
    out: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"(\d+)\. \*\*[^*]+\*\* (.*)", line)
        if m:
            for name in re.findall(r"`(agentrl[\w.]*)`", m.group(2).split(":", 1)[0]):
                assert name not in out, f"design.md names {name} in two layers"
                out[name] = int(m.group(1))
    return out


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the longest name in `table` that is `module` or a package above it (the root
    package `agentrl` stands for itself alone, not for everything)."""
    names = [n for n in table if n == module or (n != "agentrl" and module.startswith(n + "."))]
    return table[max(names, key=len)] if names else None


def upward(edges: dict[str, set[str]], table: dict[str, int]) -> list[str]:
    """Every import from a module into a higher layer, as 'a (n) -> b (m)'."""
    return sorted(f"{a} ({layer_of(a, table)}) -> {b} ({layer_of(b, table)})"
                  for a, targets in edges.items() for b in targets
                  if (layer_of(b, table) or 0) > (layer_of(a, table) or 0))


def test_circles_are_found_by_hand_made_graphs():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert sorted(map(sorted, circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}))) == [["a", "b"],
                                                                                                 ["c", "d"]]


def test_the_walk_sees_the_package_under_its_shipped_names():
    edges = graph()
    assert "agentrl.core" in edges and "agentrl.registry" in edges["agentrl.cli.flags"]
    assert "agentrl.envs.code" in edges and "agentrl.algorithms.grpo" in edges  # envs/, algorithms/
    assert "agentrl.credit" in edges["agentrl.algorithms.grpo"]
    assert not any(name.startswith(("envs", "algorithms")) for name in edges)


def test_the_package_imports_in_no_circle():
    found = circles(graph())
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_every_module_has_a_layer_and_every_layer_name_a_module():
    edges, table = graph(), layers(DESIGN.read_text())
    assert len(set(table.values())) >= 10, "design.md's layer list was not found"
    unplaced = sorted(m for m in edges if layer_of(m, table) is None)
    assert not unplaced, f"modules that no layer in docs/design.md names: {unplaced}"
    stale = sorted(n for n in table if not any(m == n or m.startswith(n + ".") for m in edges))
    assert not stale, f"docs/design.md's layers name what is no module: {stale}"


def test_imports_only_go_down_the_layers():
    up = upward(graph(), layers(DESIGN.read_text()))
    assert not up, "imports that go up docs/design.md's layers:\n" + "\n".join(up)


def test_a_planted_upward_import_is_caught():
    edges, table = graph(), layers(DESIGN.read_text())
    edges["agentrl.core"] = edges["agentrl.core"] | {"agentrl.trainer"}
    assert upward(edges, table) == [f"agentrl.core ({table['agentrl.core']}) -> agentrl.trainer "
                                    f"({table['agentrl.trainer']})"]
    # a longer name overrides its package: algorithms' registry sits below the config, its assigners above
    assert layer_of("agentrl.algorithms", table) <= layer_of("agentrl.config", table) < layer_of(
        "agentrl.algorithms.grpo", table)
    assert layer_of("agentrl.verify.probe", table) > layer_of("agentrl.verify.base", table)
    assert layer_of("agentrl.trainer", table) < layer_of("agentrl.stages.sft", table)  # the loop never imports stages


def test_the_contract_imports_nothing_above_it():
    known = modules()
    below = {"agentrl.chat", "agentrl.chat.calls", "agentrl.chat.format", "agentrl.chat.hermes"}
    assert imports("agentrl.core", known["agentrl.core"], known) <= below
