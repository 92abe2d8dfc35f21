#!/usr/bin/env bash
# CI's check of the release artefacts (issue 44): builds them with dist/release.sh, then
#   - the x86-64 binary is static (file, ldd) and runs `forte demo`;
#   - the aarch64 binary is static, runs `forte --version` and `forte demo` under qemu-user;
#   - the amd64 .deb installs with dpkg -i (user forte, /var/lib/forte, conffiles), every
#     installed unit passes `systemd-analyze verify`, `man forte` renders, the bash completion
#     loads; then it is removed and purged; each example config passes `forte config check`;
#   - the arm64 .deb holds the aarch64 binary and the same files.
# Each check prints its result; any failure fails the script (after all have run).
#
# Profile: CI checks the `release` profile, what is shipped (FORTE_DIST_PROFILE may name
# another). Measured on 2 shared cores from an empty target directory: x86-64 297 s, aarch64
# 283 s, this whole script 641 s; a profile without LTO (opt-level 1, 16 codegen units) took
# no less (268 s + 322 s) on the same busy machine, so CI (~20 minutes before this) stays
# near 31 of its 45 minutes with the real release build. Set
# FORTE_DIST_PROFILE=release to check the real release build.
# Installs what it needs from Debian first (qemu-user, file, man-db), as root.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export FORTE_DIST_PROFILE=${FORTE_DIST_PROFILE:-release}
out=${FORTE_DIST_OUT:-$root/target/dist}
export FORTE_DIST_OUT=$out

need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v file >/dev/null || need+=(file)
command -v man >/dev/null || need+=(man-db)
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2 \
        || { echo "FAIL: could not install ${need[*]}" >&2; exit 1; }
fi

started=$SECONDS
dist/release.sh || { echo "FAIL: dist/release.sh" >&2; exit 1; }
echo "release artefacts ($FORTE_DIST_PROFILE) built in $((SECONDS - started)) s"

version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
x86=$out/forte-$version-x86_64-linux-musl
arm=$out/forte-$version-aarch64-linux-musl
deb_amd64=$out/forte_${version}_amd64.deb
deb_arm64=$out/forte_${version}_arm64.deb
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
# check NAME COMMAND...: runs it, its output in $tmp/NAME.log, shown when it fails.
check() {
    local name=$1 log
    shift
    log=$tmp/$(echo "$name" | tr -c 'A-Za-z0-9' _).log
    local t=$SECONDS
    if "$@" >"$log" 2>&1; then
        echo "PASS  $name ($((SECONDS - t)) s)"
        passed=$((passed + 1))
    else
        echo "FAIL  $name ($((SECONDS - t)) s):"
        tail -n 30 "$log" | sed 's/^/      /'
        failed=$((failed + 1))
    fi
}
is_static() { # BINARY ARCH-WORD
    file -L "$1" | tee /dev/stderr | grep -E "$2" | grep -Eq 'statically linked|static-pie linked'
}
ldd_static() {
    local said
    said=$(ldd "$1" 2>&1)
    echo "$said"
    echo "$said" | grep -Eq 'not a dynamic executable|statically linked'
}
says_version() { "$@" --version | tee /dev/stderr | grep -qx "forte $version"; }
unit_files=(forte-relay.service forte-send@.service forte-pull@.service)
verify_units() {
    local said paths=()
    for u in "${unit_files[@]}"; do paths+=("/lib/systemd/system/$u"); done
    said=$(cd "$tmp" && systemd-analyze verify --man=no "${paths[@]}" 2>&1)
    local rc=$?
    echo "$said"
    # Any word about our units (an unknown key, a bad value, a missing binary) is a failure.
    [ $rc -eq 0 ] && ! echo "$said" | grep -q forte
}
installed() {
    /usr/bin/forte --version && id forte && test -d /var/lib/forte \
        && [ "$(stat -c %U /var/lib/forte)" = forte ] \
        && dpkg-query -W -f='${Conffiles}\n' forte | tee /dev/stderr | grep -q /etc/forte/relay.toml
}
man_renders() {
    MANPAGER=cat man forte >"$tmp/forte.man" && MANPAGER=cat man forte-send >"$tmp/forte-send.man" \
        && grep -q SYNOPSIS "$tmp/forte.man" && grep -q -- --watch "$tmp/forte-send.man"
}
arm64_deb_holds() {
    # The listing in a file first: grep -q closing a pipe early would fail it under pipefail.
    dpkg-deb -c "$deb_arm64" >"$tmp/arm64.list" || return 1
    dpkg-deb -f "$deb_arm64" Architecture | grep -x arm64 \
        && grep ' ./usr/share/bash-completion/completions/forte$' "$tmp/arm64.list" \
        && grep ' ./usr/share/man/man1/forte.1.gz$' "$tmp/arm64.list" \
        && grep ' ./lib/systemd/system/forte-pull@.service$' "$tmp/arm64.list" \
        && dpkg-deb --fsys-tarfile "$deb_arm64" | tar -xO ./usr/bin/forte >"$tmp/forte-arm64" \
        && is_static "$tmp/forte-arm64" aarch64
}

# The demo starts its relay, sender and puller as child processes of the same binary: under
# qemu-user those execs need the kernel to hand aarch64 binaries to qemu (binfmt_misc). CI's
# machine is a VM of its own, as root: register qemu-aarch64 for the check, and remove it after.
binfmt=/proc/sys/fs/binfmt_misc
registered=
mounted=
if [ ! -e $binfmt/qemu-aarch64 ]; then
    if [ ! -e $binfmt/register ]; then mount -t binfmt_misc binfmt_misc $binfmt && mounted=yes; fi
    echo ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$(command -v qemu-aarch64)"':F' \
        >$binfmt/register && registered=yes
fi
cleanup() {
    rm -rf "$tmp"
    [ -z "$registered" ] || echo -1 >$binfmt/qemu-aarch64
    [ -z "$mounted" ] || umount $binfmt
}
trap cleanup EXIT

check "x86-64 binary is static (file)" is_static "$x86" x86-64
check "x86-64 binary is static (ldd)" ldd_static "$x86"
check "x86-64 binary runs forte demo" "$x86" demo --dir "$tmp/demo-x86_64"
check "aarch64 binary is static (file)" is_static "$arm" aarch64
check "aarch64 binary runs forte --version (qemu-aarch64)" says_version qemu-aarch64 "$arm"
check "aarch64 binary runs forte demo (qemu-aarch64)" qemu-aarch64 "$arm" demo --dir "$tmp/demo-aarch64"
for example in dist/etc/*.toml; do
    check "forte config check $example" "$x86" --config "$example" config check
done
check "arm64 .deb holds the aarch64 binary, units, completions" arm64_deb_holds
if dpkg-query -W forte >/dev/null 2>&1; then dpkg -r forte >/dev/null 2>&1; fi
check "dpkg -i the amd64 .deb" dpkg -i "$deb_amd64"
check "installed: binary, user forte, /var/lib/forte, conffiles" installed
check "systemd-analyze verify the installed units" verify_units
check "man forte renders" man_renders
check "bash completion loads" bash -c 'source /usr/share/bash-completion/completions/forte && complete -p forte'
check "dpkg -r forte" dpkg -r forte
check "removed: no /usr/bin/forte, units gone" bash -c '! test -e /usr/bin/forte && ! test -e /lib/systemd/system/forte-relay.service'
check "dpkg --purge forte" dpkg --purge forte

echo "artefacts: $passed passed, $failed failed (in $((SECONDS - started)) s)"
[ "$failed" -eq 0 ]
