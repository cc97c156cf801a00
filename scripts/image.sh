#!/usr/bin/env bash
# Builds the `mcp-idem` container image (deploy/image/Containerfile) without a daemon, with
# `buildah`, into an OCI archive: target/dist/mcp-idem-image.oci.tar (or $DIST_DIR), tagged
# `mcp-idem:<version>`. Prints its size and the time it took.
#
# The image is FROM scratch (these machines pull no base image): the glibc-2.17 binary that
# `scripts/dist.sh binary` built (target/dist/mcp-idem-<target>), the loader and the shared
# libraries it links, taken from this machine (readelf names them, ldd finds them), Debian's CA
# roots, /etc/passwd and /etc/group for `nonroot` (uid and gid 65532), /etc/nsswitch.conf, and
# /data owned by 65532, where the default SQLite store goes. Nothing else: no shell.
#
# Needs `buildah` and the binary, and runs as root here (rootless buildah is untested). buildah keeps its
# storage under target/image/ (vfs driver, chroot isolation: no daemon, no overlay mount), and
# drops it once the archive is written. Load the archive elsewhere with e.g.
# `podman load -i target/dist/mcp-idem-image.oci.tar` or `skopeo copy oci-archive:... docker://...`.
# TARGETS (default: the host's triple) names the binaries to put in images, one per target, each
# `target/dist/mcp-idem-<target>`: with several (x86_64-unknown-linux-musl
# aarch64-unknown-linux-musl, as .github/workflows/release.yml does, untested here) the archive is
# an image index with one image per platform. A dynamically linked binary must be of this
# machine's architecture (ldd finds its libraries here); a static one may be of any. IMAGE_ARCHIVE
# names another archive.
# Usage: scripts/image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$EPOCHREALTIME

host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
# shellcheck disable=SC2206 # one word per target
targets=(${TARGETS:-${host:-x86_64-unknown-linux-gnu}})
dist=${DIST_DIR:-$root/target/dist}
archive=${IMAGE_ARCHIVE:-$dist/mcp-idem-image.oci.tar}
work=$root/target/image
command -v buildah >/dev/null || { echo "buildah is missing (apt-get install buildah)" >&2; exit 1; }
certs=/etc/ssl/certs/ca-certificates.crt
[ -s "$certs" ] || { echo "no $certs (apt-get install ca-certificates)" >&2; exit 1; }
rm -rf "$work"
storage=(--root "$work/storage" --runroot "$work/run" --storage-driver vfs)
# The image is dated by the last commit: the same sources and binary give the same image (the same
# manifest digest; the archive's own tar headers differ).
created=$(git log -1 --format=%ct 2>/dev/null || date +%s)

# stage TARGET CONTEXT: the build context of TARGET's binary (see deploy/image/Containerfile).
stage() {
    local binary=$dist/mcp-idem-$1 rootfs=$2/rootfs interpreter library needed found
    [ -x "$binary" ] || { echo "no $binary: run scripts/dist.sh binary first (TARGET=$1)" >&2; return 1; }
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$2/data"
    install -m 0755 "$binary" "$rootfs/usr/local/bin/mcp-idem"
    # What it links: its program interpreter (the loader, at the path the binary names) and each
    # library it needs, as a file where the loader looks for it (the path ldd finds on this
    # machine, symbolic links resolved). A library that ldd cannot find fails the build. A static
    # binary (musl) has neither.
    interpreter=$(readelf -l "$binary" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
    local libraries=()
    if [ -n "$interpreter" ]; then
        libraries+=("$interpreter")
        for needed in $(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
            [ "$needed" != "$(basename "$interpreter")" ] || continue # the loader, named again
            found=$(ldd "$binary" | awk -v lib="$needed" '$1 == lib && $2 == "=>" { print $3 }')
            [ -n "$found" ] && [ -e "$found" ] || { echo "ldd does not find $needed for $binary" >&2; return 1; }
            libraries+=("$found")
        done
    fi
    for library in ${libraries[@]+"${libraries[@]}"}; do
        mkdir -p "$rootfs$(dirname "$library")"
        cp -L "$library" "$rootfs$library"
    done
    # CA roots (rustls-native-certs finds them there), the one user and group, and name lookups
    # that read /etc/hosts before DNS.
    cp -L "$certs" "$rootfs$certs"
    echo "nonroot:x:65532:65532:nonroot:/data:/sbin/nologin" >"$rootfs/etc/passwd"
    echo "nonroot:x:65532:" >"$rootfs/etc/group"
    echo "hosts: files dns" >"$rootfs/etc/nsswitch.conf"
    chmod -R u=rwX,go=rX "$rootfs"
    echo "$1: the binary, ${libraries[*]:-no shared library (static)}, $certs, /etc/passwd, /etc/group, /etc/nsswitch.conf, /data"
}

version=
images=()
for target in "${targets[@]}"; do
    case $target in
    x86_64-*) platform=linux/amd64 ;;
    aarch64-*) platform=linux/arm64 ;;
    *) echo "no image platform for $target" >&2; exit 1 ;;
    esac
    stage "$target" "$work/$target"
    # The version, from the binary when it runs here, else from Cargo.toml.
    version=${version:-$("$dist/mcp-idem-$target" --version 2>/dev/null | awk '$1 == "mcp-idem" { print $2 }')}
    version=${version:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)}
    image=localhost/mcp-idem:$version-${platform#linux/}
    buildah "${storage[@]}" build --quiet --isolation chroot --format oci --timestamp "$created" \
        --platform "$platform" --build-arg "VERSION=$version" -f deploy/image/Containerfile \
        -t "$image" "$work/$target" >/dev/null
    images+=("$image")
done

# One image: the archive holds it. Several (one per platform): an image index of them.
mkdir -p "$(dirname "$archive")"
rm -f "$archive"
if [ ${#images[@]} -eq 1 ]; then
    buildah "${storage[@]}" push --quiet "${images[0]}" "oci-archive:$archive:mcp-idem:$version"
else
    buildah "${storage[@]}" manifest create "localhost/mcp-idem:$version" "${images[@]}" >/dev/null
    buildah "${storage[@]}" manifest push --quiet --all "localhost/mcp-idem:$version" \
        "oci-archive:$archive:mcp-idem:$version"
fi
buildah "${storage[@]}" rmi --all --force >/dev/null
rm -rf "$work/storage" "$work/run"

size=$(stat -c %s "$archive")
awk -v start="$start" -v end="$EPOCHREALTIME" -v size="$size" -v name="$(basename "$archive")" -v tag="mcp-idem:$version" \
    'BEGIN { printf "%s (%s): %d bytes (%.1f MiB), built in %.1f s\n", name, tag, size, size / 1048576, end - start }'
