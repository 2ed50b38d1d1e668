#!/usr/bin/env bash
# Benchmark harness for mcpheal: builds bench/cmd/mcpbench and the
# pinned vegeta (bench/tools/go.mod), then runs them from the repository root.
#
#   bench/run.sh           full run (~30 min): installs nginx from Debian when
#                          missing, writes bench/RESULTS.md and bench/latency.svg
#   bench/run.sh --smoke   CI: one short round per target, heal and storm,
#                          one 1 MB SSE event; checks every answer, not speed;
#                          uses nginx only if already installed
#   bench/run.sh -only large [-out F]
#                          only the large-SSE-event section (1 and 12 MB, ~1
#                          min): installs nginx like a full run; writes no
#                          results file unless -out is given
#   bench/run.sh -only hostile [-hostile 0,64] [-out F]
#                          only the hostile-input section (~4 min): the
#                          mcpheal binary, built from this tree, under each
#                          attack with its default limits, then with
#                          --memory-budget 64 MiB; needs no nginx or vegeta;
#                          writes no results file unless -out is given
#   bench/run.sh -peers [-peer-rates 10,100,200,1000,2000] [-peer-rounds 3] [-out F]
#                          IBM ContextForge beside nginx and mcpheal (~25
#                          min), then what it does with upstream sessions,
#                          restarts and writes: installs ContextForge from
#                          bench/peers/contextforge.lock (bench/peers/
#                          contextforge.sh, Python >= 3.12) and nginx like a
#                          full run; writes bench/RESULTS-peers.md unless
#                          -out is given. -peer-rounds 0 -peer-sweep "":
#                          the observations only (~3 min), printed (and
#                          written to -out F if given)
#
# Other arguments are passed to mcpbench (see `go run ./bench/cmd/mcpbench -h`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

smoke=0
only=""
prev=""
args=()
for a in "$@"; do
	case "$a" in
	--smoke | -smoke) smoke=1; args+=("-smoke") ;;
	-only=* | --only=*) only="${a#*=}"; args+=("$a") ;;
	-peers | --peers) only=peers; args+=("-only" "peers") ;;
	*) args+=("$a"); case "$prev" in -only | --only) only="$a" ;; esac ;;
	esac
	prev="$a"
done

have_nginx() { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }
if [ "$smoke" = 0 ] && [ "$only" != hostile ] && ! have_nginx; then
	sudo=""
	[ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo="sudo -n"; } || true
	if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; then
		echo "installing nginx (Debian package)"
		$sudo apt-get update -qq >/dev/null || true
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null 2>&1 ||
			DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx >/dev/null 2>&1 ||
			echo "note: nginx could not be installed; its target is skipped"
	else
		echo "note: nginx is not installed and apt-get is not usable; its target is skipped"
	fi
fi

if [ "$only" = peers ]; then
	# The peer's own install step: never part of a smoke run (CI).
	venv=$(bash bench/peers/contextforge.sh | tail -n 1)
	args+=("-contextforge" "$venv")
fi

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
rc=0
if [ "$only" = large ] || [ "$only" = hostile ]; then # these sections need no vegeta
	echo "building mcpbench and mcpheal"
	go build -o "$bin/mcpbench" ./bench/cmd/mcpbench
	go build -o "$bin/mcpheal" .
	"$bin/mcpbench" -mcpheal "$bin/mcpheal" "${args[@]}" || rc=$?
	exit "$rc"
fi
echo "building mcpbench, mcpheal and vegeta v12.12.0"
go build -o "$bin/mcpbench" ./bench/cmd/mcpbench
go build -o "$bin/mcpheal" .
(cd bench/tools && go build -o "$bin/vegeta" github.com/tsenart/vegeta/v12)
"$bin/mcpbench" -vegeta "$bin/vegeta" -mcpheal "$bin/mcpheal" "${args[@]}" || rc=$?
exit "$rc"
