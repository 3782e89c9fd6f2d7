#!/usr/bin/env bash
# spanprof-ci.sh: profile a benchmark in a CI job, keep its flame graph and
# report, compare it with a baseline profile and fail the build on regression.
#
# Usage:
#   spanprof-ci.sh [-b BASELINE.pb.gz] [-t THRESHOLD] [-o OUTDIR]
#                  [-m 'PATTERN=PERCENT%']... [-F HZ] -- COMMAND [ARGS...]
#
#   -b  the baseline profile (e.g. the profile.pb.gz of the last run on the
#       main branch); without it, or when the file does not exist, nothing is
#       compared
#   -t  fail when a function's share of the samples grew by more than this
#       many points (default 5%); see `spanprof diff --help` for the noise rule
#   -o  where the outputs go (default spanprof-out)
#   -m  a budget for `spanprof check --max` (repeatable)
#   -F  sampling frequency (default 999 Hz: a benchmark of a few seconds gets
#       thousands of samples, enough to tell a few points of change)
#
# Outputs in OUTDIR: profile.pb.gz (keep it as the next baseline), flame.svg,
# report.txt, report.json, and with a baseline diff.svg and diff.txt.
#
# Exit status: the benchmark's own when it fails (so a benchmark that exits 3
# reads like a regression: its message tells); 3 when a budget is exceeded or
# a function regressed; 2 for bad arguments (this script's or a bad -t or -m
# value); 1 when spanprof fails; 0 otherwise. -h prints this help.
#
# spanprof needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE); set
# SPANPROF to the command that runs it (default: spanprof), e.g.
# SPANPROF="sudo -E spanprof". Its outputs are private (mode 0600).
set -euo pipefail

baseline=""
threshold="5%"
out="spanprof-out"
frequency=999
budgets=()
usage() { sed -n '2,29p' "$0"; }
while getopts "b:t:o:m:F:h" opt; do
	case "$opt" in
	b) baseline="$OPTARG" ;;
	t) threshold="$OPTARG" ;;
	o) out="$OPTARG" ;;
	m) budgets+=(--max "$OPTARG") ;;
	F) frequency="$OPTARG" ;;
	h) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ "${1:-}" = "--" ]; then
	shift
fi
if [ $# -eq 0 ]; then
	echo "spanprof-ci.sh: no benchmark command given (after --)" >&2
	exit 2
fi
read -r -a spanprof <<<"${SPANPROF:-spanprof}"
mkdir -p "$out"

echo "::group::spanprof profile -- $*"
status=0
"${spanprof[@]}" profile -F "$frequency" --quiet \
	-o "$out/profile.pb.gz" -o "$out/flame.svg" -- "$@" || status=$?
echo "::endgroup::"
if [ "$status" -ne 0 ]; then
	echo "spanprof-ci.sh: the benchmark (or spanprof) failed with status $status" >&2
	exit "$status"
fi

"${spanprof[@]}" report "$out/profile.pb.gz" -o "$out/report.txt" -o "$out/report.json"
cat "$out/report.txt"

result=0
if [ ${#budgets[@]} -gt 0 ]; then
	"${spanprof[@]}" check "$out/profile.pb.gz" "${budgets[@]}" || result=$?
fi
if [ -n "$baseline" ] && [ -f "$baseline" ]; then
	diff_status=0
	"${spanprof[@]}" diff "$baseline" "$out/profile.pb.gz" \
		-o "$out/diff.svg" -o "$out/diff.txt" \
		--fail-on-regression "$threshold" || diff_status=$?
	if [ "$result" -eq 0 ]; then
		result=$diff_status
	fi
elif [ -n "$baseline" ]; then
	echo "spanprof-ci.sh: no baseline at $baseline: nothing compared" >&2
fi
exit "$result"
