#!/usr/bin/env bash
# Regenerates hermes.txt and sdk.txt (every package pinned, with hashes) from
# hermes.in and sdk.in with pip-tools' pip-compile, in a scratch venv on
# Python 3.11. Run it after changing a .in file, commit both files; setup.sh
# then rebuilds the venv whose lock changed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3.11}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check pip-tools==7.6.2
cd "$here"
for name in hermes sdk; do
	"$scratch/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
		--no-emit-index-url --no-emit-find-links --output-file="$name.txt" "$name.in"
done
