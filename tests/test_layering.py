"""Every include of csrc/ and include/ keeps to the layer rules of docs/ARCHITECTURE.md.

No processes, no build: reads the sources. The table below is the one in ARCHITECTURE.md's
"Include rules" (change both together): for each folder, which other folders, or which files of
them, its quoted includes may name. Also checked: torch's headers only in backend/, api/,
python/, gpu/stage/ and the public headers; every quoted include is a full path to an existing
file; the table has no cycle; the engine reads no environment variable, and RINGDIST_* variables
are read only in csrc/backend/environment.cc.
"""
import glob
import os
import re

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")

# The layers, as ARCHITECTURE.md's "Include rules" table names them. A file's layer is its
# folder under csrc/ (the subfolders of transport/ and gpu/ apart from the files above them),
# or "include" for the installed headers.
ENGINE = {"common", "reduce", "codec", "topk", "transport", "transport/tcp", "transport/shm",
          "gpu/platform", "gpu/cuda", "collectives", "gpu"}
TORCH_LAYERS = {"gpu/stage", "backend", "api", "python", "include"}
SUBLAYERED = ("transport", "gpu")

# What each layer may include besides its own files: whole layers, or single files
# (paths from the root). Rules that need more than a list are in allowed() below.
COLLECTIVES_TRANSPORT = {"csrc/transport/channel.h", "csrc/transport/board.h"}
MAY_INCLUDE = {
    "include": set(),
    "common": set(),
    "reduce": {"common"},
    "codec": {"common", "reduce"},
    "topk": {"common", "reduce"},
    "transport": {"common", "transport/tcp", "transport/shm"},  # from .cc files only
    "transport/tcp": {"common", "transport"},
    "transport/shm": {"common", "transport"},
    "gpu/platform": {"common", "reduce"},
    "gpu/cuda": {"common", "reduce", "codec", "topk", "gpu/platform"},
    "collectives": {"common", "reduce", "codec", "gpu/platform"} | COLLECTIVES_TRANSPORT,
    "gpu": {"common", "reduce", "codec", "collectives", "gpu/platform", "gpu/cuda"},
    "gpu/stage": ENGINE - {"transport", "transport/tcp", "transport/shm"},
    "backend": (ENGINE - {"transport/tcp", "transport/shm"}) | {"gpu/stage", "include"},
    "python": {"backend", "common", "include"},
}
MAY_INCLUDE["api"] = MAY_INCLUDE["backend"] | {"backend"}
EVERYWHERE = {"include/torch_ringdist/export.h"}  # the visibility macro, torch-free

TORCH_HEADER = re.compile(r"^(torch|c10|ATen|pybind11|caffe2)/|^Python\.h$")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', re.M)


def sources():
    files = glob.glob(os.path.join(REPO, "csrc", "**", "*"), recursive=True)
    files += glob.glob(os.path.join(REPO, "include", "**", "*"), recursive=True)
    return sorted(os.path.relpath(f, REPO) for f in files
                  if f.endswith(SOURCE_SUFFIXES) and os.path.isfile(f))


def layer_of(path):
    parts = path.split("/")
    if parts[0] == "include":
        return "include"
    if parts[1] in SUBLAYERED and len(parts) > 3:
        return parts[1] + "/" + parts[2]
    return parts[1]


def resolve(target):
    """The repository path a quoted include names (None if it is not a full path)."""
    if target.startswith("csrc/"):
        return target
    if target.startswith("torch_ringdist/"):
        return "include/" + target
    return None


def includes(path):
    """(line, '<' or '"', target) of every include of a file."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


def allowed(source, target):
    """Why source may not include target (both repository paths), or None."""
    src, dst = layer_of(source), layer_of(target)
    if src == dst or target in EVERYWHERE:
        return None
    rules = MAY_INCLUDE[src]
    if dst not in rules and target not in rules:
        files = sorted(r for r in rules if r.startswith("csrc/") and layer_of(r) == dst)
        only = f" but {', '.join(files)}" if files else ""
        return f"{src}/ may not include {dst}/{only} (ARCHITECTURE.md, Include rules)"
    if src == "transport" and dst in ("transport/tcp", "transport/shm") and \
            not source.endswith(".cc"):
        return "a transport header names a transport: only transport/*.cc choose tcp/ and shm/"
    return None


def test_sources_found():
    files = sources()
    assert any(f.startswith("csrc/collectives/") for f in files)
    assert any(f.startswith("include/torch_ringdist/") for f in files)
    assert {layer_of(f) for f in files} <= set(MAY_INCLUDE), "a folder the table does not know"


def test_quoted_includes_are_full_paths_to_files():
    bad = []
    for path in sources():
        for line, kind, target in includes(path):
            if kind != '"':
                continue
            resolved = resolve(target)
            if resolved is None or not os.path.isfile(os.path.join(REPO, resolved)):
                bad.append(f"{path}:{line}: \"{target}\"")
    assert not bad, "includes that are not full paths to existing files:\n" + "\n".join(bad)


def test_includes_follow_the_layers():
    bad = []
    for path in sources():
        for line, kind, target in includes(path):
            resolved = resolve(target) if kind == '"' else None
            if resolved is None:
                continue
            why = allowed(path, resolved)
            if why:
                bad.append(f"{path}:{line}: \"{target}\": {why}")
    assert not bad, "includes against the layer rules:\n" + "\n".join(bad)


def test_layers_have_no_cycle():
    # transport/ picks tcp/ and shm/ from its .cc files, which include its headers back: one
    # layer with its implementations, not two. Every other edge points down.
    edges = {layer: {r if not r.startswith("csrc/") else layer_of(r) for r in rules}
             for layer, rules in MAY_INCLUDE.items()}
    edges["transport"] -= {"transport/tcp", "transport/shm"}
    done, path = set(), []

    def visit(layer):
        if layer in path:
            return path[path.index(layer):] + [layer]
        if layer in done:
            return None
        path.append(layer)
        for below in sorted(edges[layer] - {layer}):
            cycle = visit(below)
            if cycle:
                return cycle
        path.pop()
        done.add(layer)
        return None

    for layer in sorted(edges):
        cycle = visit(layer)
        assert not cycle, "a cycle in the layer table: " + " -> ".join(cycle)


def test_torch_only_above_the_engine():
    bad = []
    for path in sources():
        if layer_of(path) in TORCH_LAYERS and path not in EVERYWHERE:
            continue
        for line, kind, target in includes(path):
            if kind == "<" and TORCH_HEADER.search(target):
                bad.append(f"{path}:{line}: <{target}>")
    assert not bad, "torch headers in the engine:\n" + "\n".join(bad)


def code(path):
    """A source file's text with // comments blanked (string literals kept)."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return re.sub(r'//(?=(?:[^"\n]*"[^"\n]*")*[^"\n]*$).*', "", f.read(), flags=re.M)


def where(path, text, m):
    """path:line: the line of a match."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.start())
    line = text[start:end if end >= 0 else len(text)].strip()
    return f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {line}"


ENV_READ = re.compile(r"\b(?:std::)?(?:secure_)?getenv\s*\(|\benviron\b")
# A RINGDIST_* name handed to getenv or to a helper around it (envOr, envString, ...).
RINGDIST_READ = re.compile(r'\b\w*env\w*\s*\(\s*"RINGDIST_\w*', re.I)
RINGDIST_LITERAL = re.compile(r'"RINGDIST_\w*')
ENVIRONMENT_CC = "csrc/backend/environment.cc"


def test_engine_reads_no_environment():
    bad = []
    for path in sources():
        if layer_of(path) in ENGINE:
            text = code(path)
            bad += [where(path, text, m) for m in ENV_READ.finditer(text)]
    assert not bad, "the engine reads the environment:\n" + "\n".join(bad)


def test_ringdist_variables_read_only_in_environment_cc():
    bad = []
    for path in sources():
        if path == ENVIRONMENT_CC:
            continue
        text = code(path)
        bad += [where(path, text, m) for m in RINGDIST_READ.finditer(text)]
        if ENV_READ.search(text):  # a file that reads the environment names no RINGDIST_*
            bad += [where(path, text, m) for m in RINGDIST_LITERAL.finditer(text)]
    bad = list(dict.fromkeys(bad))  # a read that both patterns see, once
    assert not bad, f"RINGDIST_* read outside {ENVIRONMENT_CC}:\n" + "\n".join(bad)
    assert RINGDIST_READ.search(code(ENVIRONMENT_CC)), \
        f"{ENVIRONMENT_CC} reads no RINGDIST_*: stale pattern"
