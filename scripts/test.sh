#!/usr/bin/env bash
# Runs every check of guard: formatting, lints, tests, and the no_std builds
# for Cortex-M. Installs what is missing on a fresh Debian machine with a
# Rust toolchain (rustup). CI runs exactly this script.
#
#   scripts/test.sh            the full run (what CI runs)
#   GUARD_BENCH=1 scripts/test.sh   also runs the benchmarks for real and
#                                   rewrites benches/RESULTS.md
#   GUARD_SIM_SEEDS=50 scripts/test.sh   simulates more random seeds per scenario
#   GUARD_SIM_LONG=1 scripts/test.sh    also runs every simulator scenario for a simulated week
#   LOOM_MAX_PREEMPTIONS=5 scripts/test.sh   explores more interleavings
#   GUARD_FUZZ_SECONDS=600 scripts/test.sh   fuzzes each target longer
#   SPIN_DEEP=1 scripts/test.sh   checks the protocol model at deeper bounds
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step names the time since the start and the disk left, so a slow
# step or a full disk shows.
step() {
    printf '\n==> %s  [%dm%02ds, %s free]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)) \
        "$(df -h --output=avail . 2>/dev/null | tail -n 1 | tr -d ' ')"
}

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v rustup >/dev/null 2>&1 || {
    echo "rustup is required (https://rustup.rs); cargo alone cannot add the embedded targets" >&2
    exit 1
}

step "toolchain: components and embedded targets (Cortex-M, RISC-V)"
for component in rustfmt clippy; do
    rustup component list --installed | grep -q "^${component}" || rustup component add "$component"
done
targets=(thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imc-unknown-none-elf)
installed=$(rustup target list --installed)
for target in "${targets[@]}"; do
    grep -qx "$target" <<<"$installed" || rustup target add "$target"
done

step "system packages: redis-server, redis-tools, mosquitto, mosquitto-clients, qemu-system-arm, qemu-system-misc, nats-server, mariadb, postgresql, rabbitmq-server, etcd-server, protobuf-compiler, binutils, spin, gcc"
need_packages=()
command -v redis-server >/dev/null 2>&1 || need_packages+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_packages+=(redis-tools)
# Debian installs the broker in /usr/sbin; the tests start their own.
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || need_packages+=(mosquitto)
# The namespace test's MQTT subscriber (mosquitto_sub).
command -v mosquitto_sub >/dev/null 2>&1 || need_packages+=(mosquitto-clients)
# The firmware test runs on QEMU's Cortex-M4F board, and on its RISC-V
# virt machine (Debian's qemu-system-misc).
qemu_packages=()
command -v qemu-system-arm >/dev/null 2>&1 || qemu_packages+=(qemu-system-arm)
command -v qemu-system-riscv32 >/dev/null 2>&1 || qemu_packages+=(qemu-system-misc)
# The other sources' tests: NATS and MariaDB servers of their own (a
# private mariadbd logs rows to its binlog), PostgreSQL (a database of
# their own on the machine's server, and a private server), RabbitMQ (a
# virtual host of their own on the machine's broker, and a private node).
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1 || need_packages+=(nats-server)
[ -x /usr/sbin/mariadbd ] || need_packages+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need_packages+=(mariadb-client)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_packages+=(postgresql)
command -v psql >/dev/null 2>&1 || need_packages+=(postgresql-client)
[ -x /usr/sbin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 || need_packages+=(rabbitmq-server)
# guard-etcd: its tests start an etcd cluster of their own (never the
# machine's service), and etcd-client's build compiles etcd's protobufs.
command -v etcd >/dev/null 2>&1 || need_packages+=(etcd-server)
command -v protoc >/dev/null 2>&1 || need_packages+=(protobuf-compiler)
# The firmware's size by section and by crate (scripts/firmware-size.sh).
for tool in size objdump addr2line; do
    command -v "$tool" >/dev/null 2>&1 || { need_packages+=(binutils); break; }
done
# The gateway's systemd unit is checked by systemd-analyze (verify, and
# its offline security score).
command -v systemd-analyze >/dev/null 2>&1 || need_packages+=(systemd)
# The gateway's alert rules: promtool checks them and runs their tests.
command -v promtool >/dev/null 2>&1 || need_packages+=(prometheus)
# The Promela model of the lease and fencing protocol: spin, and a C
# compiler for its verifiers.
command -v spin >/dev/null 2>&1 || need_packages+=(spin)
command -v gcc >/dev/null 2>&1 || need_packages+=(gcc)
if [ ${#need_packages[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing Debian packages: ${need_packages[*]}; run as root or install them first" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_packages[@]}"
fi
if [ ${#qemu_packages[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing Debian packages: ${qemu_packages[*]}; run as root or install them first" >&2
        exit 1
    fi
    # The emulators share qemu-system-common with qemu-utils: where the
    # machine's qemu-utils is a backport, they must come from the same
    # backports suite, or apt refuses the pair.
    qemu_suite=()
    if [[ "$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)" == *bpo* ]]; then
        codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
        if ! grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
            echo "deb http://deb.debian.org/debian ${codename}-backports main" \
                >"/etc/apt/sources.list.d/${codename}-backports.list"
        fi
        qemu_suite=(-t "${codename}-backports")
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${qemu_suite[@]}" "${qemu_packages[@]}"
fi

step "services: PostgreSQL on 5432 and RabbitMQ on 5672"
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if ! listening 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
    # The tests connect over TCP as `postgres` without a password.
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | head -n 1)
    if ! grep -q "^host all all 127.0.0.1/32 trust" "$hba"; then
        sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main reload
    fi
fi
if ! listening 5672; then
    rabbitmq-server -detached
    for _ in $(seq 60); do listening 5672 && break; sleep 1; done
fi

step "format"
cargo fmt --all -- --check

# The gateway's optional etcd locker is built and tested too (its build
# needs protoc, installed above; the main job's build does not), its
# OpenTelemetry exporter, and
# guard-core's fuzzing harnesses for users (feature arbitrary, host only),
# the disk queue's storage comparison (redb and fjall beside it), and
# guard-embassy's queue on NOR flash.
features=(--features guard-gateway/etcd --features guard-gateway/otel --features guard-core/arbitrary --features guard-benches/storage-candidates --features guard-embassy/flash --features guard-embassy/tls)

step "clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked "${features[@]}" -- -D warnings

step "tests"
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
cargo test --workspace --locked "${features[@]}" 2>&1 | tee "$test_log"

step "docs (warnings are errors) and the publishable crates packaged"
# What docs.rs shows: every public item documented, every link resolved.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked "${features[@]}"
# The crates a user adds (boards, benches, the simulator and the testkit
# are not published): each packaged, together (they depend on each
# other), and built from its package as a user's build would (about a
# minute here, the dependencies being built already).
publishable=(guard-core guard-std guard-smol guard-tokio guard-redis guard-etcd guard-postgres guard-embassy guard-endpoints guard-tower guard-server)
cargo package --locked --allow-dirty "${publishable[@]/#/-p}"
# The packages and their verification builds are not needed again.
rm -rf target/package

step "loom models (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
# A project-specific cfg: a global `--cfg loom` would change third-party
# crates too. Its own target directory keeps the normal build cached.
# guard-example-loom is how a user model-checks their own code with
# guard's shared types under the same switch.
RUSTFLAGS="--cfg guard_loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" CARGO_TARGET_DIR=target/loom \
    cargo test --release --locked -p guard-core -p guard-std -p guard-example-loom --test loom

step "guard-core and guard-embassy build for Cortex-M and RISC-V with no allocator"
# thumbv7em: Cortex-M4F; thumbv6m: Cortex-M0, which has no compare-and-swap;
# riscv32imc: the ESP32-C3 class, which has no atomic instructions either.
for target in "${targets[@]}"; do
    # (Not `features`: that array is the tests' and the benchmarks'.)
    for crate_features in "" "critical-section" "defmt,critical-section"; do
        echo "-- guard-core $target ${crate_features:+(features: $crate_features)}"
        cargo build -p guard-core --target "$target" --locked ${crate_features:+--features "$crate_features"}
    done
    for crate_features in "" "defmt,flash,tls"; do
        echo "-- guard-embassy $target ${crate_features:+(features: $crate_features)}"
        cargo build -p guard-embassy --target "$target" --locked ${crate_features:+--features "$crate_features"}
    done
done

step "firmware: guard on a Cortex-M4F under QEMU (mps2-an386), checked on target"
# Its own workspace (it builds only for thumbv7em-none-eabihf); the runner
# in .cargo/config.toml starts QEMU, and a failed check exits 1. The
# release build makes every image: the checks, net-replica and tls-locker
# (run by the namespace test below), footprint, empty and decisions.
(
    cd boards/mps2-an386
    cargo fmt --check
    cargo clippy --release --locked --bins -- -D warnings
    cargo build --release --locked --features defmt
    cargo build --release --locked
    timeout 120 cargo run --release --locked
)
mps2=boards/mps2-an386/target/thumbv7em-none-eabihf/release
qemu_m4=(qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic -semihosting-config enable=on,target=native)
# The footprint images exit 1 on a wrong decision, like the checks; the
# outbox image boots three times in one run, through two power cuts (a
# reset in a flash write, then in a page erase), and exits 1 if anything
# acknowledged is lost, reordered or half-read.
for image in empty footprint footprint-outbox outbox; do timeout 60 "${qemu_m4[@]}" -kernel "$mps2/$image"; done

step "firmware: guard on a Cortex-M0 under QEMU (microbit, nRF51), checked on target"
# No compare-and-swap on this core: guard-core's critical-section feature.
# Its own workspace too; its runner starts QEMU's microbit machine.
(
    cd boards/microbit
    cargo fmt --check
    cargo clippy --release --locked -- -D warnings
    timeout 120 cargo run --release --locked
)

step "firmware: guard on a RISC-V core under QEMU (virt, rv32imc code), checked on target"
# The Cortex-M0's checks (boards/checks, shared), and the footprint image
# (boards/footprint, shared with the Cortex-M4F), on QEMU's virt machine;
# a failed check exits 1. The shared crates are linted for a core without
# compare-and-swap, as they run.
for shared in boards/checks boards/footprint; do
    (cd "$shared" && cargo fmt --check && cargo clippy --locked --target thumbv6m-none-eabi -- -D warnings)
done
(
    cd boards/riscv-virt
    cargo fmt --check
    cargo clippy --release --locked --bins -- -D warnings
    # Every image (`cargo run` builds only the checks).
    cargo build --release --locked
    timeout 120 cargo run --release --locked
)
riscv=boards/riscv-virt/target/riscv32imc-unknown-none-elf/release
qemu_rv=(qemu-system-riscv32 -machine virt -bios none -nographic -semihosting-config enable=on,target=native)
for image in empty footprint; do timeout 60 "${qemu_rv[@]}" -kernel "$riscv/$image"; done

step "firmware footprint (flash and static RAM) and each decision's cost on the Cortex-M4F"
# guard itself costs footprint minus empty: a budget of 8 KiB of flash,
# and the step fails past it.
scripts/firmware-size.sh --budget 8192 "$mps2/empty" "$mps2/footprint"
scripts/firmware-size.sh "$mps2/empty" "$mps2/footprint" "$mps2/footprint-outbox" "$mps2/guard-firmware-mps2" "$mps2/net-replica" "$mps2/tls-locker" \
    boards/microbit/target/thumbv6m-none-eabi/release/guard-firmware-microbit
# The same four parts on the RISC-V core (rv32imc), reported beside them.
flash_of() { scripts/firmware-size.sh "$1" | sed -E 's/.*flash ([0-9]+) bytes.*/\1/'; }
ram_of() { scripts/firmware-size.sh "$1" | sed -E 's/.*RAM ([0-9]+) bytes.*/\1/'; }
echo "the dead-letter queue on flash (guard-embassy's flash feature, sequential-storage) on the Cortex-M4F:" \
    "$(( $(flash_of "$mps2/footprint-outbox") - $(flash_of "$mps2/empty") )) bytes of flash and" \
    "$(( $(ram_of "$mps2/footprint-outbox") - $(ram_of "$mps2/empty") )) bytes of static RAM beyond empty"
scripts/firmware-size.sh "$riscv/empty" "$riscv/footprint" "$riscv/guard-firmware-riscv-virt"
echo "guard's four parts on RISC-V (riscv32imc): $(( $(flash_of "$riscv/footprint") - $(flash_of "$riscv/empty") )) bytes of flash beyond empty"
echo "net-replica's code by crate:"
scripts/firmware-size.sh --crates "$mps2/net-replica"
echo "tls-locker's code by crate (TLS: embedded-tls and the crypto crates below it):"
scripts/firmware-size.sh --crates "$mps2/tls-locker"
# Instructions per decision (QEMU has no cycle counter; see decisions.rs).
timeout 120 "${qemu_m4[@]}" -icount shift=0 -kernel "$mps2/decisions"

step "namespaces: TAP replicas and the firmware under QEMU electing through Redis (AUTH), publishing through an MQTT broker restart, locking over TLS, a queue on a full disk (root only)"
# Ignored by a plain `cargo test` (they need root), so a run without root
# counts them as ignored, never as passed. One at a time: each runs
# several replicas (one of them QEMU), and the takeover is timed. The
# firmware image was built by the step above.
if [ "$(id -u)" -eq 0 ]; then
    cargo test --locked -p guard-tap-replica --test netns -- --ignored --test-threads=1 2>&1 | tee -a "$test_log"
    # A sink's queue on a tmpfs that fills, in a mount namespace.
    # The tests step's build of the gateway's process tests, run again
    # for the one that needs root (a cargo call of its own would build
    # with other features).
    processes=$(grep -o 'target/debug/deps/processes-[0-9a-f]*' "$test_log" | head -n 1)
    (cd boards/gateway && "../../$processes" a_queue_on_a_full_disk --ignored) 2>&1 | tee -a "$test_log"
else
    echo "not root: the namespace test is not run (counted as ignored)"
fi

step "the protocol model: spin checks leases, fences and slots exhaustively (negative runs must fail)"
# SPIN_DEEP=1 adds deeper bounds. A negative run that finds no
# counterexample fails the step, as does an incomplete search.
bash sim/spin/check.sh

step "the main job: three replicas, every slot once (exit 1 on a duplicate)"
# The binary the tests step built (`cargo run --release -p guard-gateway --
# demo` is the same program; a second, optimised build of the gateway took
# minutes here).
"${CARGO_TARGET_DIR:-target}/debug/guard-gateway" demo --seconds 4

if [ "${GUARD_CROSS_ALL:-0}" = "1" ]; then
    step "static gateways for x86_64, aarch64 and armv7, small and full sets, each run under qemu-user"
    bash scripts/cross.sh --all
else
    step "a static aarch64 gateway (Redis and MQTT sources, HTTP sink) at most 6 MiB, run under qemu-user"
    bash scripts/cross.sh
fi

step "the simulator: every scenario for a simulated day on five replicas"
cargo run --release --locked -p guard-sim -- --seed 1 --scenario all --duration 86400 --replicas 5 \
    --svg target/guard-sim.svg
if [ "${GUARD_SIM_LONG:-0}" = "1" ]; then
    step "the simulator: every scenario for a simulated week on five replicas"
    GUARD_SIM_LONG=1 cargo test --release --locked -p guard-sim --test scenarios a_simulated_week -- --nocapture
fi

step "fuzz targets: build each, run each for ${GUARD_FUZZ_SECONDS:-15} s"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
(cd fuzz && cargo fmt --check && CARGO_BUILD_JOBS=2 cargo +nightly fuzz build -O)
for target in $(cd fuzz && cargo +nightly fuzz list); do
    # A scratch copy: runs grow their corpus without touching the seed.
    work="target/fuzz-corpus/$target"
    rm -rf "$work" && mkdir -p "$work" && cp fuzz/corpus/"$target"/* "$work"/
    log="target/fuzz-$target.log"
    if ! (cd fuzz && cargo +nightly fuzz run -O "$target" "../$work" -- \
        -max_total_time="${GUARD_FUZZ_SECONDS:-15}" -max_len=512 >"../$log" 2>&1); then
        # The panic's message first: the input's debug print can push it
        # out of the tail.
        grep -m 1 -A 3 -E 'panicked at|ERROR: libFuzzer' "$log" >&2 || true
        tail -n 40 "$log" >&2
        echo "fuzz target $target failed; its input is in fuzz/artifacts/$target" >&2
        exit 1
    fi
    echo "$target: $(grep -E '^Done' "$log")"
done

step "benchmarks run"
if [ "${GUARD_BENCH:-0}" = "1" ]; then
    cargo bench -p guard-benches --locked --bench limiters
    cargo run --release --locked -p guard-benches --bin bench-results
    cargo bench -p guard-sim --locked --bench slots
else
    # Each benchmark once, as a test: proves they run without timing them.
    # The test profile and the features of the tests step, so that the
    # build above is reused rather than a second, optimised one made.
    cargo test --workspace --bench '*' --locked "${features[@]}" -- --test
fi

step "all checks passed"
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$test_log"
