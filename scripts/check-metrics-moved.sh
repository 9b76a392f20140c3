#!/bin/bash
# Fails when a counter the daemon serves was never moved by any test of the run that
# collected DIR (each test's daemon appends `name value` lines for every counter it
# serves, zeros included, to DIR/*.txt when REBOUND_METRICS_MOVED=DIR).
set -euo pipefail
dir=${1:?usage: check-metrics-moved.sh DIR}
shopt -s nullglob
files=("$dir"/*.txt)
if [ ${#files[@]} -eq 0 ]; then
    echo "check-metrics-moved: no daemon metrics collected in $dir" >&2
    exit 1
fi
never=$(awk '{ if (!($1 in max) || $2 > max[$1]) max[$1] = $2 }
             END { for (n in max) if (max[n] == 0) print n }' "${files[@]}" | sort)
names=$(awk '{ print $1 }' "${files[@]}" | sort -u | wc -l)
if [ -n "$never" ]; then
    echo "check-metrics-moved: counters no test moved (of $names):" $never >&2
    exit 1
fi
echo "check-metrics-moved: every one of the daemon's $names counters was moved by a test"
