#!/usr/bin/env bash
# What a heal runs: the coverage of one tools/call that meets an expired Go
# SDK session (TestFootprintHeal) against the same call on a live session
# (TestFootprintCall); bench/cmd/healcover counts the blocks the heal ran
# more often: files, functions, lines (docs/healing.md "What a heal runs").
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# mcpheal's code the proxy's tests link: the test peers (proxy/internal/peers)
# are not measured, nor the packages those tests do not link.
pkgs=$(go list ./proxy/... ./session/... ./upstream/... ./classify/... |
	grep -vE '/proxy/(internal/peers|interop|doctor)$|/logintest$' | paste -sd, -)
go test ./proxy -run '^TestFootprintCall$' -count=1 -cpu 1 -covermode=count -coverpkg="$pkgs" -coverprofile="$tmp/base.out" >/dev/null
go test ./proxy -run '^TestFootprintHeal$' -count=1 -cpu 1 -covermode=count -coverpkg="$pkgs" -coverprofile="$tmp/heal.out" >/dev/null
go run ./bench/cmd/healcover . "$tmp/base.out" "$tmp/heal.out"
