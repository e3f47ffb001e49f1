#!/usr/bin/env bash
# Static (musl) guard-gateway binaries for small boxes, in the `dist`
# profile: each measured, then run (`guard-gateway demo`) under qemu-user
# (natively for x86_64).
#
#   scripts/cross.sh         aarch64, the small set: Redis and MQTT
#                            sources, the HTTP sink, no TLS (at most 6 MiB)
#   scripts/cross.sh --all   x86_64, aarch64 and armv7, each with the small
#                            set and the full one (every source kind, TLS,
#                            the etcd locker, the OpenTelemetry exporter)
#
# The small set is pure Rust: aarch64 links with rust-lld against the
# musl that rustup ships with the target, no C compiler. The full set
# compiles C (ring, zstd): with Debian's cross gcc and musl's headers and
# specs for the target (musl-dev of the target's architecture). rustup
# ships no standard library for armv7 musl here, so armv7 builds it from
# source (nightly, -Zbuild-std) and links with that gcc and musl, libgcc's
# unwinder standing in for libunwind. Installs what is missing, as root.
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
case "${1:-}" in
    "") ;;
    --all) all=1 ;;
    *)
        echo "usage: $0 [--all]" >&2
        exit 2
        ;;
esac

limit=$((6 * 1024 * 1024))
out="${CARGO_TARGET_DIR:-target}"
mkdir -p "$out/cross-tools"
tools=$(realpath "$out/cross-tools")

apt_install() {
    local missing=()
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    [ "${#missing[@]}" -eq 0 ] && return
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# A C compiler for a musl target: Debian's gcc for the architecture with
# musl's specs (musl's headers, crt objects and libc instead of glibc's).
musl_gcc() { # name gcc specs-dir
    cat >"$tools/$1" <<EOF
#!/bin/sh
exec $2 "\$@" -specs /usr/lib/$3/musl-gcc.specs
EOF
    chmod +x "$tools/$1"
    echo "$tools/$1"
}

# Builds `guard-gateway` for $1 with the cargo arguments after it; sets
# `binary`.
build() {
    local target=$1
    shift
    local cargo=(cargo build --locked --quiet --profile dist -p guard-gateway --target "$target" "$@")
    local env=()
    case "$target" in
        aarch64-unknown-linux-musl)
            rustup target list --installed | grep -qx "$target" || rustup target add "$target"
            env+=(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld)
            [ "$all" = 1 ] && env+=("CC_aarch64_unknown_linux_musl=$(musl_gcc aarch64-musl-gcc aarch64-linux-gnu-gcc aarch64-linux-musl)")
            ;;
        x86_64-unknown-linux-musl)
            rustup target list --installed | grep -qx "$target" || rustup target add "$target"
            env+=(CC_x86_64_unknown_linux_musl=musl-gcc)
            ;;
        armv7-unknown-linux-musleabihf)
            rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
            rustup component list --toolchain nightly --installed | grep -q '^rust-src' ||
                rustup component add rust-src --toolchain nightly
            local gcc
            gcc=$(musl_gcc armv7-musl-gcc arm-linux-gnueabihf-gcc arm-linux-musleabihf)
            mkdir -p "$tools/armv7-lib"
            ln -sf "$(arm-linux-gnueabihf-gcc -print-file-name=libgcc_eh.a)" "$tools/armv7-lib/libunwind.a"
            env+=(
                "CARGO_TARGET_ARMV7_UNKNOWN_LINUX_MUSLEABIHF_LINKER=$gcc"
                "CC_armv7_unknown_linux_musleabihf=$gcc"
                "CARGO_TARGET_ARMV7_UNKNOWN_LINUX_MUSLEABIHF_RUSTFLAGS=-C link-self-contained=no -L $tools/armv7-lib"
            )
            cargo=(cargo +nightly build -Zbuild-std=std,panic_abort "${cargo[@]:2}")
            ;;
    esac
    env "${env[@]}" "${cargo[@]}"
    binary="$out/$target/dist/guard-gateway"
}

# Runs the demo on `binary` for $1 and prints its verdict.
demo() {
    local runner=()
    case "$1" in
        aarch64-*) runner=(qemu-aarch64-static) ;;
        armv7-*) runner=(qemu-arm-static) ;;
    esac
    local report
    report=$(mktemp)
    if ! RUST_LOG=warn "${runner[@]}" "$binary" demo --replicas 3 --seconds 3 >"$report"; then
        cat "$report"
        rm -f "$report"
        echo "guard-gateway demo failed on $1" >&2
        exit 1
    fi
    grep -E '^(duplicates|missed slots)' "$report" | tr -s ' ' | paste -sd ',' | sed 's/^/  demo: /'
    rm -f "$report"
}

# Prints the size of `binary`, built for $1 with set $2; past $3 bytes
# (when given) it fails.
measure() {
    local bytes
    bytes=$(stat -c %s "$binary")
    printf '%s, %s: %d bytes (%d.%02d MiB)\n' "$1" "$2" "$bytes" \
        $((bytes / 1048576)) $((bytes % 1048576 * 100 / 1048576))
    if [ -n "${3:-}" ] && [ "$bytes" -gt "$3" ]; then
        echo "over $(($3 / 1048576)) MiB" >&2
        exit 1
    fi
}

small=(--no-default-features --features http)
full=(--features etcd,otel)

apt_install qemu-user-static
if [ "$all" = 0 ]; then
    build aarch64-unknown-linux-musl "${small[@]}"
    measure aarch64-unknown-linux-musl "Redis and MQTT sources, HTTP sink" "$limit"
    demo aarch64-unknown-linux-musl
    exit 0
fi

if ! dpkg --print-foreign-architectures | grep -qx armhf || ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture armhf
    dpkg --add-architecture arm64
    apt-get update -qq
fi
apt_install musl-tools gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf musl-dev:arm64 musl-dev:armhf protobuf-compiler
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl armv7-unknown-linux-musleabihf; do
    build "$target" "${small[@]}"
    measure "$target" "Redis and MQTT sources, HTTP sink" "$limit"
    demo "$target"
    build "$target" "${full[@]}"
    measure "$target" "every source kind, TLS, etcd, OpenTelemetry"
    demo "$target"
done
