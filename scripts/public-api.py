#!/usr/bin/env python3
"""Counts the public API of the library crate `mcp-idempotency`, from rustdoc's JSON output.

    scripts/public-api.py            build the JSON (all features) and print the counts
    scripts/public-api.py --list     also list every public path
    scripts/public-api.py FILE.json  count an existing rustdoc JSON file

Every path an embedder can name is counted once: modules, items, enum variants, public fields,
inherent methods and associated constants, trait items. Trait impls are not counted. An item
re-exported at a second path is counted at each, and listed under "items with more than one path"
(the target is none). rustdoc's JSON output is unstable, so on a stable toolchain the script sets
RUSTC_BOOTSTRAP=1 for that one rustdoc run, in its own target directory (target/public-api).
"""

import collections
import json
import os
import subprocess
import sys


def build_json(repo):
    target = os.path.join(repo, "target", "public-api")
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", CARGO_TARGET_DIR=target)
    subprocess.run(
        ["cargo", "rustdoc", "-q", "-p", "mcp-idempotency", "--all-features", "--",
         "-Z", "unstable-options", "--output-format", "json"],
        cwd=repo, env=env, check=True)
    return os.path.join(target, "doc", "mcp_idempotency.json")


def count(doc):
    index = doc["index"]
    seen = set()
    paths = []  # (path, kind)

    def item(i):
        return index.get(str(i))

    def walk(i, path):
        it = item(i)
        if it is None or it.get("crate_id") != 0:
            return
        kind = next(iter(it["inner"]))
        if kind == "use":
            target = it["inner"]["use"].get("id")
            if target is not None and item(target) is not None:
                walk_named(target, path[:-1] + [it["inner"]["use"]["name"]])
            return
        walk_named(i, path)

    def walk_named(i, path):
        it = item(i)
        kind = next(iter(it["inner"]))
        if it.get("visibility") != "public" or (i, tuple(path)) in seen:
            return
        seen.add((i, tuple(path)))
        if path:
            paths.append(("::".join(path), kind))
        body = it["inner"][kind]
        if kind == "module":
            for child in body["items"]:
                c = item(child)
                if c is not None:
                    walk(child, path + [c.get("name") or ""])
            return
        if kind == "struct" and isinstance(body.get("kind"), dict) and "plain" in body["kind"]:
            for f in body["kind"]["plain"].get("fields", []):
                field = item(f)
                if field and field.get("visibility") == "public":
                    paths.append(("::".join(path + [field["name"]]), "field"))
        if kind == "enum":
            for v in body.get("variants", []):
                paths.append(("::".join(path + [item(v)["name"]]), "variant"))
        if kind == "trait":
            for t in body.get("items", []):
                paths.append(("::".join(path + [item(t)["name"]]), "trait item"))
        for imp in body.get("impls", []) if kind in ("struct", "enum", "union") else []:
            impl = item(imp)["inner"]["impl"]
            if impl.get("trait") is not None or impl.get("blanket_impl") or impl.get("is_synthetic"):
                continue
            for m in impl["items"]:
                member = item(m)
                if member and member.get("visibility") == "public":
                    paths.append(("::".join(path + [member["name"]]), "associated " + next(iter(member["inner"]))))

    walk(doc["root"], [])
    by_item = collections.defaultdict(list)
    for i, path in seen:
        by_item[i].append("::".join(path))
    return paths, {i: sorted(p) for i, p in by_item.items() if len(p) > 1}


def main():
    args = [a for a in sys.argv[1:] if a != "--list"]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    file = args[0] if args else build_json(repo)
    with open(file) as f:
        paths, multiple = count(json.load(f))
    kinds = collections.Counter(kind for _, kind in paths)
    if "--list" in sys.argv:
        for path, kind in sorted(paths):
            print(f"{path}  [{kind}]")
    top = sum(n for k, n in kinds.items() if k not in ("variant", "field", "trait item") and not k.startswith("associated"))
    print(f"public paths: {len(paths)} (items and modules: {top}; the rest are variants, fields, methods, associated and trait items)")
    for kind, n in sorted(kinds.items()):
        print(f"  {kind}: {n}")
    print(f"items with more than one path: {len(multiple)}")
    for p in multiple.values():
        print("  " + ", ".join(p))


if __name__ == "__main__":
    main()
