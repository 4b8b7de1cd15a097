#!/usr/bin/env python3
"""Fails if modules of server/src import each other in a circle.

Two checks, each over the paths written in the code (comments and `#[cfg(test)]` blocks
skipped):

1. The top-level modules (a folder counts as one): dependencies must point one way, front end ->
   lifecycle -> tenants -> engine/config.
2. The files, inside folders too: a path (`crate::a::b::C`, `super::b::C`, `self::b`, or a child
   module's name) is an edge to the file that defines what it names: the file that declares
   the longest module prefix of it, or, for a name a `mod.rs` re-exports from a child
   (`pub use child::C`, or `pub use child::*` for what the child defines), that child.
   (`pub(in path)` names where an item is seen, not what it uses: no edge.) A folder's `mod.rs` declares its children, and that is an
   edge to each of them: so a child that imports anything its parent `mod.rs` defines closes
   a circle (move the shared thing down into a child of its own). A circle among files is a
   circle: one file's change reaches the other both ways.

Every circle found is printed (as its strongly connected files); the exit status is 1 if
there is any.

Usage: python3 scripts/import-cycles.py [server/src]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "server/src")

# Module path (tuple of names) -> file, for every file under root.
files = {}
for path in sorted(root.rglob("*.rs")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts in (("lib",), ("main",)):
        continue
    if parts[-1] == "mod":
        parts = parts[:-1]
    files[parts] = path


def code_of(path):
    """The file's code without comments and without its `#[cfg(test)]` items."""
    out = []
    pending = False  # the line after `#[cfg(test)]` starts the item to skip
    depth = None  # brace depth inside a skipped item
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        if depth is not None:
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                depth = None
            continue
        if stripped.startswith("#[cfg(test)]"):
            pending = True
            continue
        if pending:
            if stripped.startswith("#["):
                continue  # another attribute of the same item
            pending = False
            if "{" in line:
                depth = line.count("{") - line.count("}")
                if depth <= 0:
                    depth = None
            continue  # a one-line item (`mod tests;`, `use ...;`) is skipped whole
        out.append(line)
    # `pub(in crate::x)` names where an item is visible, not something it uses.
    return re.sub(r"pub\(in [^)]*\)", "pub", "\n".join(out))


GROUP = re.compile(r"((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*)\}")


def expand_groups(code):
    """`a::{b, c::{d, e}}` written out as `a::b, a::c::d, a::c::e`, so each name is an edge."""
    while True:
        expanded = GROUP.sub(
            lambda m: ", ".join(
                m.group(1) if n.strip() == "self" else f"{m.group(1)}::{n.strip()}"
                for n in m.group(2).split(",")
                if n.strip()
            ),
            code,
        )
        if expanded == code:
            return code
        code = expanded


PATH = re.compile(r"\b((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


REEXPORT = re.compile(r"\bpub(?:\([a-z]+\))?\s+use\s+(?:self::)?([a-z_][a-z0-9_]*)::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|\*)\s*;", re.S)
DEFINED = re.compile(r"^pub(?:\([^)]*\))?\s+(?:async\s+)?(?:fn|struct|enum|trait|const|static|type|mod)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)


def reexports(module):
    """Names a folder's `mod.rs` re-exports from its own children: name -> child module."""
    out = {}
    path = files.get(module)
    if path is None or path.name != "mod.rs":
        return out
    code = code_of(path)
    found = [(c, n) for c, n in REEXPORT.findall(code) if module + (c,) in files]
    # As Rust resolves: a name the `mod.rs` defines or re-exports by name beats a glob's.
    own = set(DEFINED.findall(code))
    for child, names in found:  # `pub use child::*`: every public item the child defines
        if names == "*":
            for name in DEFINED.findall(code_of(files[module + (child,)])):
                if name not in own:
                    out[name] = module + (child,)
    for child, names in found:  # `pub use child::{A, B}`: one level
        if names == "*":
            continue
        for name in names.strip("{}").split(","):
            name = name.strip().split(" as ")[-1].strip()
            if name and name != "self":
                out[name] = module + (child,)
    return out


def resolve(module, path):
    """The module path a written path starts in, or None if it is not one of ours."""
    names = path.split("::")
    if names[0] == "crate":
        base, rest = (), names[1:]
    elif names[0] in ("super", "self"):
        base = module
        rest = names
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif module + (names[0],) in files:
        base, rest = module, names  # a child module named without `self::`
    elif (names[0],) in files and len(module) == 0:
        base, rest = (), names
    else:
        return None
    best = base if base in files else None
    cur = base
    for name in rest:
        if cur in files and name in reexports_of(cur):
            return reexports_of(cur)[name]
        cur = cur + (name,)
        if cur in files:
            best = cur
        else:
            break
    return best


_reexports = {}


def reexports_of(module):
    if module not in _reexports:
        _reexports[module] = reexports(module)
    return _reexports[module]


edges = {}
for module, path in files.items():
    if module and module[-1] == "tests":
        continue
    code = expand_groups(code_of(path))
    found = set()
    for written in PATH.findall(code):
        target = resolve(module, written)
        if target is None or target == module or (target and target[-1] == "tests"):
            continue
        if not target:
            continue
        found.add(target)
    # A folder's mod.rs declares (and composes) its children.
    if path.name == "mod.rs":
        found.update(m for m in files if len(m) == len(module) + 1 and m[:-1] == module)
    found.discard(module)
    edges[module] = {t for t in found if t[-1] != "tests"}

# Check 1: top-level modules.
top = {}
for module, targets in edges.items():
    top.setdefault(module[0], set()).update(t[0] for t in targets if t[0] != module[0])


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
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

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


failed = False
for comp in circles(top):
    failed = True
    print("import circle among top-level modules: " + ", ".join(comp))
for comp in circles(edges):
    failed = True
    print("import circle among files: " + ", ".join(str(files[m].relative_to(root)) for m in comp))
    for m in comp:
        inside = sorted(str(files[t].relative_to(root)) for t in edges[m] if t in comp)
        print(f"  {files[m].relative_to(root)} -> {', '.join(inside)}")
if failed:
    sys.exit(1)
print(
    f"no import circles among {len(top)} top-level modules and {len(edges)} files of {root}"
)
