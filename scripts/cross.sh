#!/usr/bin/env bash
# A static (musl) guard-gateway for a small aarch64 box, in the `dist`
# profile: Redis and MQTT sources and the HTTP sink (no TLS). Measured
# (at most 6 MiB), then run (`guard-gateway demo`) under qemu-user.
#
#   scripts/cross.sh
#
# The build is pure Rust: it links with rust-lld against the target's own
# musl, no C cross compiler. Installs what is missing (the rustup target;
# Debian's qemu-user-static, as root).
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-musl
limit=$((6 * 1024 * 1024))

rustup target list --installed | grep -qx "$target" || rustup target add "$target"
if ! command -v qemu-aarch64-static >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static
fi

CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld \
    cargo build --locked --quiet --profile dist -p guard-gateway \
    --no-default-features --features http --target "$target"
binary="${CARGO_TARGET_DIR:-target}/$target/dist/guard-gateway"
bytes=$(stat -c %s "$binary")
printf '%s, Redis and MQTT sources, HTTP sink: %d bytes (%d.%02d MiB)\n' "$target" "$bytes" \
    $((bytes / 1048576)) $((bytes % 1048576 * 100 / 1048576))
if [ "$bytes" -gt "$limit" ]; then
    echo "over 6 MiB" >&2
    exit 1
fi

report=$(mktemp)
trap 'rm -f "$report"' EXIT
RUST_LOG=warn qemu-aarch64-static "$binary" demo --replicas 3 --seconds 3 >"$report" || {
    cat "$report"
    echo "guard-gateway demo failed under qemu-aarch64" >&2
    exit 1
}
grep -E '^(duplicates|missed slots)' "$report"
