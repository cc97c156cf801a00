#!/usr/bin/env bash
# Builds the distributable artifacts, which install and run without a Rust toolchain, into
# target/dist/ (or $DIST_DIR):
#
#   wheel   mcp_idempotency-*-cp310-abi3-manylinux_2_17_*.whl: the Python binding (maturin with
#           zig, `--compatibility manylinux2014`), checked with `auditwheel show`;
#   npm     mcp-idempotency-*.tgz: the npm package (`npm pack`) with its prebuilt addon
#           mcp-idempotency.<platform>.node (napi-rs CLI, `--cross-compile`: cargo-zigbuild);
#           the addon also stays in bindings/node, so the package works in place there;
#   binary  mcp-idem-<target>: the `mcp-idem` binary (cargo-zigbuild).
#
# With no argument it builds all three. Every Linux glibc artifact is linked against glibc 2.17
# (zig's `<triple>.2.17` target), the manylinux2014 baseline, and checked: no symbol of a newer
# glibc (readelf), and the wheel by auditwheel. Needs a Rust toolchain (rustup, for the target), Python >= 3.10 and Node.js >= 20; the
# build tools come from PyPI (maturin, ziglang, cargo-zigbuild, auditwheel, pinned below, into a
# venv under target/) and npm (@napi-rs/cli, pinned by bindings/node/package-lock.json).
#
# TARGET (default: the host's triple) picks another target, as .github/workflows/release.yml does
# for macOS and Linux aarch64 (untested here); the glibc check runs for *-linux-gnu targets.
# Usage: scripts/dist.sh [wheel|npm|binary]...
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

export CARGO_INCREMENTAL=0
target=${TARGET:-$(rustc -vV | sed -n 's/^host: //p')}
glibc=2.17
dist=${DIST_DIR:-$root/target/dist}
mkdir -p "$dist"

# Linux targets build with zig (maturin `--zig`, cargo-zigbuild, napi `--cross-compile`):
# `x86_64-unknown-linux-gnu.2.17` links against glibc 2.17's symbols. macOS targets build with the
# platform's own toolchain (Xcode links for either architecture).
case $target in
*-linux-gnu) zig_target=$target.$glibc ;;
*-linux-*) zig_target=$target ;;
*) zig_target= ;;
esac

# The build tools, from PyPI, in a venv of their own; `zig` is ziglang's (`python -m ziglang`),
# which cargo-zigbuild and maturin find through the venv's python on PATH. cargo-zigbuild is the
# version maturin embeds, and the wheel's build names cargo-zigbuild as the program of its zig
# wrappers (see wheel()): the three builds then hand cargo the same linker and C compiler, so the
# wheel, the addon and the binary share the crates they build alike (same features) in
# target/<target>/release instead of building them once per tool.
tools=${DIST_TOOLS:-$root/target/dist-tools}
pins="maturin[zig]==1.16.0 ziglang==0.17.1 cargo-zigbuild==0.24.0 auditwheel==6.8.2"
if [ "$(cat "$tools/pins" 2>/dev/null)" != "$pins" ]; then
    python3 -m venv "$tools"
    # shellcheck disable=SC2086 # one word per pin
    "$tools/bin/pip" install --quiet --disable-pip-version-check $pins
    echo "$pins" >"$tools/pins"
fi
export PATH="$tools/bin:$PATH"
rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"

# Fails when the ELF file $1 needs a glibc symbol newer than $glibc.
check_glibc() {
    case $target in *-linux-gnu) ;; *) return 0 ;; esac
    local newest
    newest=$(readelf -W --dyn-syms "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
    echo "$(basename "$1"): newest glibc symbol version $newest (baseline $glibc)"
    if [ "$(printf '%s\n%s\n' "$newest" "$glibc" | sort -V | tail -n1)" != "$glibc" ]; then
        echo "$1 needs glibc $newest, newer than $glibc" >&2
        return 1
    fi
}

wheel() {
    rm -f "$dist"/mcp_idempotency-*.whl
    local options=()
    case $target in
    *-linux-gnu) options=(--zig --compatibility manylinux2014) ;;
    *-linux-*) options=(--zig) ;;
    esac
    # cargo-zigbuild writes its zig wrappers (cargo's linker, CC_<target>...) into a folder named
    # after the program that runs it (wrappers/<crc of its path>/), and cargo fingerprints the
    # linker: with maturin's own wrappers, every crate the wheel built counted as dirty for the
    # addon's and the binary's cargo-zigbuild, which built it again in place, and the next wheel
    # build again (112 of the 154 units of the addon). CARGO_BIN_EXE_cargo-zigbuild (the program
    # its wrappers run, honoured by the cargo-zigbuild 0.24.0 inside maturin 1.16.0) names the
    # venv's cargo-zigbuild: the same wrapper files as the other two builds, same content. It is a
    # hook of cargo-zigbuild's own tests: a version that drops it only stops the sharing.
    (cd bindings/python && env "CARGO_BIN_EXE_cargo-zigbuild=$tools/bin/cargo-zigbuild" \
        maturin build --release --quiet --target "$target" ${options[@]+"${options[@]}"} --out "$dist")
    local built
    built=$(ls "$dist"/mcp_idempotency-*.whl)
    case $target in
    *-linux-gnu)
        auditwheel show "$built" | tee "$dist/auditwheel.txt"
        grep -q 'manylinux_2_17_' "$dist/auditwheel.txt" || {
            echo "auditwheel: $built is not manylinux2014 (glibc 2.17)" >&2
            return 1
        }
        local native
        native=$(mktemp -d)
        python3 -m zipfile -e "$built" "$native"
        check_glibc "$(ls "$native"/mcp_idempotency/_native*.so)"
        rm -rf "$native"
        ;;
    esac
}

npm_package() {
    (
        cd bindings/node
        # @napi-rs/cli and the package's dev dependencies (the binding's tests use them); no
        # install hook (it would build the addon the plain way).
        npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
        rm -f ./*.node
        if [ -n "$zig_target" ]; then
            node_modules/.bin/napi build --platform --release --no-js --dts native.d.ts \
                --cross-compile --target "$zig_target"
        else
            node_modules/.bin/napi build --platform --release --no-js --dts native.d.ts --target "$target"
        fi
        check_glibc "$(ls ./*.node)"
        rm -f "$dist"/mcp-idempotency-*.tgz
        npm pack --silent --pack-destination "$dist" >/dev/null
    )
    local packed addon
    packed=$(ls "$dist"/mcp-idempotency-*.tgz)
    addon=$(tar -tzf "$packed" | grep '^package/mcp-idempotency\..*\.node$' || true)
    [ -n "$addon" ] || {
        echo "$packed has no prebuilt addon" >&2
        return 1
    }
    echo "$(basename "$packed"): $addon"
}

binary() {
    if [ -n "$zig_target" ]; then
        cargo zigbuild --release --locked -p mcp-idem --target "$zig_target"
    else
        cargo build --release --locked -p mcp-idem --target "$target"
    fi
    local built=${CARGO_TARGET_DIR:-$root/target}/$target/release/mcp-idem
    check_glibc "$built"
    cp "$built" "$dist/mcp-idem-$target"
    echo "mcp-idem-$target: $("$dist/mcp-idem-$target" --version 2>/dev/null || echo "built for $target")"
}

[ $# -gt 0 ] || set -- wheel npm binary
for artifact in "$@"; do
    case $artifact in
    wheel) wheel ;;
    npm) npm_package ;;
    binary) binary ;;
    *)
        echo "usage: scripts/dist.sh [wheel|npm|binary]..." >&2
        exit 2
        ;;
    esac
done
echo "artifacts in $dist:"
ls -1 "$dist"
