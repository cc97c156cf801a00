#!/usr/bin/env python3
"""Checks that the three release artifacts build their shared dependencies with the same features.

The wheel (bindings/python), the npm addon (bindings/node) and the `mcp-idem` binary are three
release builds of one checkout; a dependency built with other features in one of them is built
again, with everything above it (minutes of CI). crates/artifact-features asks for the union.
This lists, from `cargo tree`, each dependency whose features differ between the three builds for
the same kind of unit, and exits 1 when there is one: add what it names to
crates/artifact-features/Cargo.toml.

    python3 scripts/artifact-features.py
"""
import re
import subprocess
import sys

PACKAGES = ["mcp-idempotency-python", "mcp-idempotency-node", "mcp-idem"]
# Built with other features on purpose (each artifact enables its own parts of the library).
OWN = {"mcp-idempotency"}


def features(package):
    """{(name, version): {features as printed, one per kind of unit}} of a package's build."""
    tree = subprocess.run(
        ["cargo", "tree", "-p", package, "-f", "{p} [{f}]", "--prefix", "none",
         "-e", "normal,build", "--target", "x86_64-unknown-linux-gnu"],
        capture_output=True, text=True, check=True,
    ).stdout
    found = {}
    for line in tree.splitlines():
        line = line.replace(" (*)", "").replace(" (proc-macro)", "").strip()
        match = re.match(r"(\S+) v(\S+)(?: \(.*?\))? \[(.*)\]", line)
        if match:
            found.setdefault((match[1], match[2]), set()).add(match[3])
    return found


def main():
    builds = {package: features(package) for package in PACKAGES}
    differ = 0
    for crate in sorted(set().union(*builds.values())):
        if crate[0] in OWN:
            continue
        sets = {p: b[crate] for p, b in builds.items() if crate in b}
        # A kind of unit one build has and another lacks (a host crate of the binary only) is
        # built once anyway: what must hold is that the builds share one set of features.
        if len(sets) > 1 and not set.intersection(*sets.values()):
            print(f"{crate[0]} {crate[1]}: " + "; ".join(f"{p} {sorted(s)}" for p, s in sets.items()))
            differ += 1
    print(f"{differ} shared dependencies built with other features")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
