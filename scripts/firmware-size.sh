#!/usr/bin/env bash
# Flash and static RAM of firmware images, and which crates their code
# comes from.
#
#   scripts/firmware-size.sh ELF...            one line per image
#   scripts/firmware-size.sh --crates ELF      its code (.text) by crate
#   scripts/firmware-size.sh --budget BYTES EMPTY ELF
#                                              ELF's flash beyond EMPTY's,
#                                              exit 1 if it is BYTES or more
#
# Flash is .vector_table + .text + .rodata + .data (the initial values);
# RAM is .data + .bss + .uninit, static only (the stack is not counted).
# Code is attributed by the DWARF line table, so code inlined from one
# crate into another counts for the crate it was written in (symbol sizes
# would charge it all to the caller, e.g. an executor's task poll).
set -euo pipefail

usage() {
    echo "usage: $0 ELF...   or   $0 --crates ELF   or   $0 --budget BYTES EMPTY ELF" >&2
    exit 2
}

# An image this script can read: an ELF file `size` knows.
readable() {
    [ -f "$1" ] || { echo "$1: no such file" >&2; exit 1; }
    size -A "$1" >/dev/null || { echo "$1: not an ELF image size can read" >&2; exit 1; }
}

# Flash, then static RAM, in bytes.
flash_and_ram() {
    readable "$1"
    size -A "$1" | awk '
        $1 == ".vector_table" || $1 == ".text" || $1 == ".rodata" || $1 == ".data" { flash += $2 }
        $1 == ".data" || $1 == ".bss" || $1 == ".uninit" { ram += $2 }
        END { printf "%d %d\n", flash, ram }'
}

sizes() {
    local flash ram
    read -r flash ram < <(flash_and_ram "$1")
    printf "%s: flash %d bytes, RAM %d bytes (static)\n" "$(basename "$1")" "$flash" "$ram"
}

budget() {
    local limit=$1 empty=$2 elf=$3 base image cost
    [[ "$limit" =~ ^[0-9]+$ ]] || { echo "--budget: '$limit' is not a number of bytes" >&2; exit 2; }
    read -r base _ < <(flash_and_ram "$empty")
    read -r image _ < <(flash_and_ram "$elf")
    cost=$((image - base))
    if [ "$cost" -ge "$limit" ]; then
        echo "$(basename "$elf") costs $cost bytes of flash beyond $(basename "$empty"): over its budget of $limit" >&2
        exit 1
    fi
    echo "$(basename "$elf") costs $cost bytes of flash beyond $(basename "$empty") (budget: under $limit)"
}

crates() {
    local elf=$1 text_start text_size
    readable "$elf"
    read -r text_size text_start < <(size -A "$elf" | awk '$1 == ".text" { print $2, $3 }')
    # Every address where the line table starts a row, in order; addr2line
    # names the source file of each (the innermost inlined one).
    objdump --dwarf=decodedline "$elf" \
        | awk -v lo="$text_start" -v hi="$((text_start + text_size))" '
            NF >= 3 && $3 ~ /^0x/ { a = strtonum($3); if (a >= lo && a < hi) print a }' \
        | sort -n -u | awk '{ printf "0x%x\n", $1 }' \
        | addr2line -e "$elf" -a \
        | paste - - \
        | awk -v hi="$((text_start + text_size))" '
        function crate_of(path) {
            if (path ~ /\/library\/[a-z_-]+\//) {
                sub(/.*\/library\//, "", path); sub(/\/.*/, "", path); return path
            }
            if (path ~ /\/registry\/src\/[^\/]+\//) {
                sub(/.*\/registry\/src\/[^\/]+\//, "", path); sub(/\/.*/, "", path)
                sub(/-[0-9]+\.[0-9]+\.[0-9]+.*$/, "", path); return path
            }
            if (path ~ /\/adapters\/embassy\//) return "guard-embassy"
            if (path ~ /\/boards\/tap-replica\//) return "guard-tap-replica"
            if (path ~ /\/boards\/[^\/]+\//) return "this board'\''s firmware"
            if (path ~ /\/core\/src\//) return "guard-core"
            return "no line information"
        }
        { n++; at[n] = strtonum($1); owner[n] = crate_of($2) }
        END {
            if (n == 0) {
                print "no line table: build the image with debug information (debug = 2)" > "/dev/stderr"
                exit 1
            }
            for (i = 1; i <= n; i++) {
                next_at = (i < n) ? at[i + 1] : hi
                bytes[owner[i]] += next_at - at[i]
                total += next_at - at[i]
            }
            for (c in bytes) printf "%8d bytes %5.1f%%  %s\n", bytes[c], 100 * bytes[c] / total, c | "sort -rn"
            close("sort -rn")
            printf "%8d bytes of code in all\n", total
        }'
}

if [ $# -eq 0 ]; then
    usage
elif [ "$1" = "--crates" ]; then
    [ $# -eq 2 ] || usage
    crates "$2"
elif [ "$1" = "--budget" ]; then
    [ $# -eq 4 ] || usage
    budget "$2" "$3" "$4"
else
    for elf in "$@"; do sizes "$elf"; done
fi
