#!/usr/bin/env bash
# Installs the Python MCP stacks that proxy/interop runs through mcpheal, in
# two virtual environments under .venv/ beside this script (they conflict:
# hermes-agent pins mcp 1.26.0, the SDK stack is mcp 2.3.0):
#   .venv/hermes  hermes.txt: hermes-agent[mcp] 0.19.0 (its MCP client, its CLI)
#   .venv/sdk     sdk.txt:    mcp 2.3.0 and fastmcp 4.1.6 (clients and servers)
# Each lock file pins every package with its hashes; pip installs exactly
# those (--require-hashes --no-deps) and nothing else. A venv is rebuilt from
# scratch when its lock file changed: the lock's sha256 is kept inside it
# (.venv/NAME/lock.sha256) and written last, so an interrupted install is
# redone. The wheels are kept between runs (and clones) in a wheelhouse,
# $MCPHEAL_PY_WHEELS or ~/.cache/mcpheal-interop/wheels: a rebuild installs
# from it without the network when it holds every wheel, and pip checks
# each wheel against the lock's hashes either way.
#
# Usage: setup.sh [hermes|sdk]... (default: both). Needs python3.11 (or
# $PYTHON). lock.sh beside it regenerates the lock files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3.11}"
wheels="${MCPHEAL_PY_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/mcpheal-interop/wheels}"

if ! command -v "$python" >/dev/null 2>&1; then
	echo "setup.sh: $python is not on PATH: the Python interop fixtures need CPython 3.11" >&2
	exit 1
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
	echo "setup.sh: $python is Python $version, the lock files are for 3.11" >&2
	exit 1
fi

build() {
	local name=$1 lock="$here/$1.txt" venv="$here/.venv/$1" want have start
	want=$(sha256sum "$lock" | cut -d' ' -f1)
	have=$(cat "$venv/lock.sha256" 2>/dev/null || true)
	if [ "$want" = "$have" ] && [ -x "$venv/bin/python" ]; then
		echo "setup.sh: .venv/$name is up to date ($name.txt ${want:0:12})"
		return 0
	fi
	start=$(date +%s)
	echo "setup.sh: building .venv/$name from $name.txt (${want:0:12})"
	rm -rf "$venv"
	"$python" -m venv "$venv"
	local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
	local exact=(--require-hashes --no-deps --only-binary=:all: -r "$lock")
	if ! "${pip[@]}" install --quiet --no-index --find-links "$wheels" "${exact[@]}" 2>/dev/null; then
		mkdir -p "$wheels"
		"${pip[@]}" download --quiet --dest "$wheels" "${exact[@]}"
		"${pip[@]}" install --quiet --no-index --find-links "$wheels" "${exact[@]}"
	fi
	"$venv/bin/python" -m pip check
	echo "$want" >"$venv/lock.sha256"
	echo "setup.sh: .venv/$name built in $(($(date +%s) - start)) s"
}

# One install at a time: a second run (another go test) waits for the first
# and then finds its venvs up to date.
mkdir -p "$here/.venv"
exec 9>"$here/.venv/setup.lock"
flock 9

envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(hermes sdk)
for name in "${envs[@]}"; do
	case "$name" in
	hermes | sdk) build "$name" ;;
	*)
		echo "setup.sh: unknown environment $name (hermes or sdk)" >&2
		exit 2
		;;
	esac
done
