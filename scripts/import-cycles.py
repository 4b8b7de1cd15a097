#!/usr/bin/env python3
"""Fails if the top-level modules of server/src import each other in a cycle.

Each module's dependencies are the `crate::NAME` paths in its files (comments skipped; a
folder module counts as one). Dependencies must point one way: front end -> lifecycle ->
tenants -> engine/config.

Usage: python3 scripts/import-cycles.py [server/src]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "server/src")
deps = {}
for path in root.rglob("*.rs"):
    rel = path.relative_to(root)
    module = rel.parts[0].removesuffix(".rs")
    if module in ("lib", "main"):
        continue
    code = "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")
    )
    found = set(re.findall(r"crate::([a-z_][a-z0-9_]*)", code)) - {module}
    deps.setdefault(module, set()).update(found)

# Depth-first search for a back edge; report the first cycle found.
state = {}
stack = []


def visit(m):
    state[m] = "open"
    stack.append(m)
    for d in sorted(deps.get(m, ())):
        if state.get(d) == "open":
            cycle = stack[stack.index(d):] + [d]
            sys.exit("import cycle: " + " -> ".join(cycle))
        if d not in state:
            visit(d)
    stack.pop()
    state[m] = "done"


for m in sorted(deps):
    if m not in state:
        visit(m)
print(f"no import cycles among {len(deps)} modules of {root}")
