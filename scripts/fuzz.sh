#!/usr/bin/env bash
# `make fuzz`: every cargo-fuzz target in fuzz/ for FUZZ_SECONDS each (default 20) on
# the nightly toolchain, with overflow checks on. New inputs the fuzzer keeps go to
# fuzz/target/work/<target>; the repository's corpus (fuzz/corpus/<target>) is only
# read. A crash stops the run and leaves its input under fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_EACH=${FUZZ_SECONDS:-20}

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "make fuzz needs Rust nightly (cargo-fuzz uses its sanitizer flags): rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: installing it (cargo install --locked cargo-fuzz)"
    cargo install --locked cargo-fuzz
fi

cargo +nightly fuzz build -O -a
mkdir -p target/tmp
start=$(date +%s)
for t in $(cargo +nightly fuzz list); do
    mkdir -p "target/work/$t"
    log="target/work/$t.log"
    echo "== $t: ${SECONDS_EACH} s"
    # The harness writes path-taking parsers' inputs under TMPDIR: keep them here.
    if ! TMPDIR="$PWD/target/tmp" cargo +nightly fuzz run -O -a "$t" "target/work/$t" "corpus/$t" -- \
        -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        # The failing input's bytes are in fuzz/artifacts: leave its Debug dump out.
        grep -v '^#[0-9]' "$log" | sed '/^Output of `std::fmt::Debug`/,/^Reproduce with/d' | tail -40
        echo "fuzz target $t failed: its input is under fuzz/artifacts/$t/ (full log: fuzz/$log)" >&2
        exit 1
    fi
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^Done ' "$log" | sed 's/^/   /'
done
rm -rf target/tmp
echo "all fuzz targets ran clean in $(( $(date +%s) - start )) s"
