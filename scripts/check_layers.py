#!/usr/bin/env python3
"""Fails when an #include in csrc/ goes up the layers or sideways between two
folders of one layer, when a file outside the adapter includes torch, or when
a file's code leaves its layer's namespace.

The layers are the `layers` block of docs/ARCHITECTURE.md, top first: one line
per layer, the folders of that layer separated by spaces (a folder is a
directory under csrc/, or transport/<kind> for each transport). A file may
include files of its own folder and of any folder on a LOWER line; folders on
one line must not include each other. Since every include goes strictly down,
no include cycle between folders can form. A folder missing from the block
fails too: a new folder takes its place in the design before it takes code.

Each folder's code lives in its own namespace (namespace_of): roce for
common, roce::adapter for the torch adapter, roce::<folder> for the rest
(roce::transport::verbs for transport/verbs). A file may open another
layer's namespace only to forward-declare a class in it, and may bring in
(`using namespace`) only the namespaces of layers below its own.

    python3 scripts/check_layers.py [--root DIR]   # DIR holds csrc/ and docs/

Exit 0 and one summary line when the tree obeys; exit 1 with one line per
offending include otherwise. No dependencies beyond Python's standard library."""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
NAMESPACE_BLOCK = re.compile(r"^namespace (roce(?:::\w+)*) \{\n(.*?)^\}", re.M | re.S)
USING_DIRECTIVE = re.compile(r"^\s*using namespace (roce(?:::\w+)*);", re.M)
FORWARD_DECLARATION = re.compile(r"^(?:class|struct) \w+;$")
# roce_torch_headers.hpp: the adapter's precompiled torch headers (csrc/torch/pch/)
TORCH_HEADERS = ("torch/", "c10/", "ATen/", "pybind11/", "Python.h", "roce_torch_headers.hpp")
ADAPTER = "torch"
SOURCES = (".cpp", ".hpp", ".h", ".cc", ".cu")


def read_layers(doc_path):
    """Returns ({folder: level}, [line of folders]), level 0 = the top layer."""
    text = open(doc_path, encoding="utf-8").read()
    m = re.search(r"^```layers\n(.*?)^```", text, re.M | re.S)
    if not m:
        sys.exit(f"check_layers: {doc_path} has no ```layers block (the layer order, top first)")
    levels, lines = {}, []
    for line in m.group(1).splitlines():
        folders = line.split("#", 1)[0].split()
        if not folders:
            continue
        for f in folders:
            if f in levels:
                sys.exit(f"check_layers: folder {f} appears twice in the layers block of {doc_path}")
            levels[f] = len(lines)
        lines.append(folders)
    return levels, lines


def folder_of(csrc, path):
    parts = os.path.relpath(path, csrc).split(os.sep)
    if len(parts) == 1:
        return "."
    if parts[0] == "transport" and len(parts) > 2:
        return "transport/" + parts[1]
    return parts[0]


def namespace_of(folder):
    if folder == "common":
        return "roce"
    if folder == ADAPTER:
        return "roce::adapter"
    return "roce::" + folder.replace("/", "::")


def check_namespaces(rel, src, text, levels, lines):
    """The namespace rules of the docstring, for one file of csrc/<src>."""
    problems = []
    own = namespace_of(src)
    folder_by_namespace = {namespace_of(f): f for f in levels}
    for m in NAMESPACE_BLOCK.finditer(text):
        name, body = m.group(1), m.group(2)
        if name == own or name.startswith(own + "::"):
            continue
        code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("//")]
        if not all(FORWARD_DECLARATION.match(line) for line in code):
            lineno = text.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{lineno}: opens namespace {name} with code in it: the code of csrc/{src} "
                            f"lives in {own} (another layer's namespace takes forward declarations only)")
    for m in USING_DIRECTIVE.finditer(text):
        name = m.group(1)
        lineno = text.count("\n", 0, m.start()) + 1
        dst = folder_by_namespace.get(name)
        if dst is None:
            if not name.startswith(own + "::"):
                problems.append(f"{rel}:{lineno}: using namespace {name}, which is no layer's namespace")
        elif levels[dst] <= levels[src] and dst != src:
            where = "a layer above it" if levels[dst] < levels[src] else "side by side with it"
            problems.append(f"{rel}:{lineno}: using namespace {name}: csrc/{src} (layer "
                            f"{' '.join(lines[levels[src]])}) must not bring in csrc/{dst}, {where}")
    return problems


def check(root):
    csrc = os.path.join(root, "csrc")
    levels, lines = read_layers(os.path.join(root, "docs", "ARCHITECTURE.md"))
    problems, includes = [], 0
    for dirpath, _, names in os.walk(csrc):
        for name in sorted(names):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            src = folder_of(csrc, path)
            if src not in levels:
                problems.append(f"{rel}: folder csrc/{src} is not in the layers block of docs/ARCHITECTURE.md")
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
            problems.extend(check_namespaces(rel, src, text, levels, lines))
            for m in INCLUDE.finditer(text):
                lineno = text.count("\n", 0, m.start()) + 1
                kind, target = m.group(1), m.group(2)
                if kind == "<":
                    if target.startswith(TORCH_HEADERS) and src != ADAPTER:
                        problems.append(f"{rel}:{lineno}: includes <{target}>: only csrc/{ADAPTER}/ may include "
                                        "torch, c10, ATen or pybind11 headers")
                    continue
                includes += 1
                resolved = os.path.normpath(os.path.join(dirpath, target))
                if not os.path.exists(resolved):
                    problems.append(f"{rel}:{lineno}: includes \"{target}\", which does not exist")
                    continue
                if not resolved.startswith(csrc + os.sep):
                    continue
                dst = folder_of(csrc, resolved)
                if dst == src:
                    continue
                if dst not in levels:
                    problems.append(f"{rel}:{lineno}: includes \"{target}\" of csrc/{dst}, a folder not in the "
                                    "layers block of docs/ARCHITECTURE.md")
                elif levels[dst] < levels[src]:
                    problems.append(f"{rel}:{lineno}: includes \"{target}\": csrc/{src} (layer "
                                    f"{' '.join(lines[levels[src]])}) must not include csrc/{dst}, a layer above it")
                elif levels[dst] == levels[src]:
                    problems.append(f"{rel}:{lineno}: includes \"{target}\": csrc/{src} and csrc/{dst} are "
                                    "side by side in one layer and must not include each other")
    return problems, includes, len(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    problems, includes, layers = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) or namespace(s) break the layers of docs/ARCHITECTURE.md")
        return 1
    print(f"check_layers: {includes} includes and the namespaces in csrc/ follow the {layers} layers of "
          "docs/ARCHITECTURE.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
