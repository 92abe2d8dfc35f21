#!/usr/bin/env bash
# Builds forte's release artefacts into target/dist/ (FORTE_DIST_OUT):
#   forte-VERSION-x86_64-linux-musl, forte-VERSION-aarch64-linux-musl   static binaries (musl:
#       no particular glibc; they run on RHEL 8, Ubuntu 20.04, any Linux of that architecture)
#   forte-VERSION-ARCH-linux-musl.tar.gz   the binary, man pages, completions, units, configs
#   forte_VERSION_amd64.deb, forte_VERSION_arm64.deb   the Debian packages
#   SHA256SUMS
# Usage: dist/release.sh [x86_64|aarch64 ...]   (default: both)
#
# The toolchain: rustup's musl targets, and cargo-zigbuild with zig (both from PyPI, pinned
# below, in a venv at target/dist-python) as the C compiler and linker for the C code in the
# tree (zstd-sys, libsqlite3-sys bundled, ring), so no cross gcc or musl-tools is needed.
# The musl build uses mimalloc as its allocator (crates/forte/src/main.rs): musl's own malloc
# is slow under forte's many threads (docs/benchmarks.md).
#
# Profile: FORTE_DIST_PROFILE, `release` by default (thin LTO, 4 codegen units: what is
# shipped); CI's artefact check (.ci/artefacts.sh) builds and checks that same profile. Both
# targets from an empty target directory took 297 s + 283 s on 2 shared cores.
#
# Builds go to CARGO_TARGET_DIR if set, else target/dist-build (not the shared target/, so a
# release build does not evict the test build). Man pages and completions for both packages
# come from the binary that runs on this machine (same CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
profile=${FORTE_DIST_PROFILE:-release}
out=${FORTE_DIST_OUT:-$root/target/dist}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/dist-build}
venv=$root/target/dist-python
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(x86_64 aarch64)
version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')

say() { printf '== %s\n' "$*" >&2; }

tools() {
    say "toolchain: rustup targets, cargo-zigbuild and zig in $venv"
    for arch in "${arches[@]}"; do rustup target add "$arch-unknown-linux-musl" >&2; done
    if ! "$venv/bin/cargo-zigbuild" --version >/dev/null 2>&1; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet cargo-zigbuild==0.24.0 ziglang==0.17.0
    fi
    export PATH="$venv/bin:$PATH"
}

# Builds the static binary of one architecture; prints its path.
build() {
    local arch=$1 target=$1-unknown-linux-musl started=$SECONDS
    say "cargo zigbuild --profile $profile -p forte --target $target"
    cargo zigbuild --locked --profile "$profile" -p forte --target "$target" >&2
    say "built $target in $((SECONDS - started)) s"
    local dir=$profile
    [ "$profile" = dev ] && dir=debug
    echo "$CARGO_TARGET_DIR/$target/$dir/forte"
}

# Man pages (gzipped) and completions from the binary that runs here, into $1.
docs() {
    local host_bin=$1 dir=$2
    mkdir -p "$dir/man1" "$dir/completions"
    "$host_bin" man "$dir/man1"
    gzip -9nf "$dir"/man1/*.1
    "$host_bin" completions bash >"$dir/completions/forte.bash"
    "$host_bin" completions zsh >"$dir/completions/_forte"
    "$host_bin" completions fish >"$dir/completions/forte.fish"
}

# The package's tree for one architecture under $1 (binary $2, docs $3).
stage() {
    local tree=$1 bin=$2 docs=$3
    rm -rf "$tree"
    install -Dm0755 "$bin" "$tree/usr/bin/forte"
    install -d "$tree/usr/share/man/man1"
    install -m0644 "$docs"/man1/*.1.gz "$tree/usr/share/man/man1/"
    install -Dm0644 "$docs/completions/forte.bash" "$tree/usr/share/bash-completion/completions/forte"
    install -Dm0644 "$docs/completions/_forte" "$tree/usr/share/zsh/vendor-completions/_forte"
    install -Dm0644 "$docs/completions/forte.fish" "$tree/usr/share/fish/vendor_completions.d/forte.fish"
    install -d "$tree/lib/systemd/system" "$tree/etc/forte"
    install -m0644 dist/systemd/*.service "$tree/lib/systemd/system/"
    install -m0644 dist/etc/*.toml "$tree/etc/forte/"
    install -Dm0644 dist/debian/copyright "$tree/usr/share/doc/forte/copyright"
}

# The .deb of one architecture from its staged tree.
package() {
    local tree=$1 deb_arch=$2 deb=$3
    install -d "$tree/DEBIAN"
    local size
    size=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)
    sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$deb_arch/" -e "s/@SIZE@/$size/" \
        dist/debian/control >"$tree/DEBIAN/control"
    (cd "$tree" && find etc -type f | sed 's|^|/|' | sort) >"$tree/DEBIAN/conffiles"
    install -m0755 dist/debian/postinst dist/debian/prerm dist/debian/postrm "$tree/DEBIAN/"
    dpkg-deb --root-owner-group -Zxz --build "$tree" "$deb" >&2
}

tools
mkdir -p "$out"
declare -A bins
for arch in "${arches[@]}"; do bins[$arch]=$(build "$arch"); done
host=$(uname -m)
host_bin=${bins[$host]:-}
if [ -z "$host_bin" ]; then
    host_bin="$(build "$host")"
fi
docs "$host_bin" "$out/docs"
for arch in "${arches[@]}"; do
    case $arch in x86_64) deb_arch=amd64 ;; aarch64) deb_arch=arm64 ;; *) echo "unknown arch $arch" >&2; exit 2 ;; esac
    name=forte-$version-$arch-linux-musl
    cp "${bins[$arch]}" "$out/$name"
    tree=$out/stage-$deb_arch
    stage "$tree" "${bins[$arch]}" "$out/docs"
    tar -C "$tree" --owner=0 --group=0 -czf "$out/$name.tar.gz" usr etc lib
    package "$tree" "$deb_arch" "$out/forte_${version}_$deb_arch.deb"
done
(cd "$out" && sha256sum forte-* forte_*.deb >SHA256SUMS)
say "artefacts ($profile) in $out:"
(cd "$out" && ls -l forte-* forte_*.deb SHA256SUMS) >&2
