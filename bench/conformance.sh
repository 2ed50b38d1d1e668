#!/usr/bin/env bash
# Runs the conformance table (TestConformanceTable in
# proxy/interop/conformance_table_test.go: the official MCP conformance
# suite, pinned in proxy/interop/testdata/conformance, against three
# servers and a client, directly and through mcpheal) and writes it to
# bench/conformance.md. About 30 s; needs npm the first time (npm ci).
set -euo pipefail
cd "$(dirname "$0")/.."
table=$(mktemp)
trap 'rm -f "$table"' EXIT
MCPHEAL_CONFORMANCE_TABLE="$table" go test ./proxy/interop -run '^TestConformanceTable$' -count=1 >/dev/null
{
	cat <<'HEAD'
# Conformance: directly and through mcpheal

The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.2.0-alpha.12, pinned), every
scenario each revision requires, written by `bench/conformance.sh` (`TestConformanceTable` in
`proxy/interop/conformance_table_test.go`, which asserts what the table shows on every `go test ./...`).

- Server mode, against the Go SDK 1.8.0 conformance everything-server: *both eras* (stateless, both
  revisions), *session era only* (with sessions, behind a shim that refuses 2026-07-28 as the TypeScript
  SDK v1 does) and *2026-07-28 only* (behind a shim that refuses the session era as the TypeScript SDK v2's
  `legacy: 'reject'` does). Through mcpheal a 2026-07-28 agent of a session-era server takes the held
  route, a session-era agent of a 2026-07-28-only server the bridge (docs/eras.md).
- Client mode, the Go SDK 1.8.0 everything-client against the suite's scenario servers.
- A scenario passes when it failed no scored check; checks count `SUCCESS` verdicts (a check repeats once
  per request a scenario sees).

HEAD
	cat "$table"
	cat <<'TAIL'

What the table asserts, and the checks that differ:

- Where mcpheal has nothing to translate, no check that passes directly fails through mcpheal, and none
  fails there that does not directly. The stateless server of both eras gains at 2025-11-25: mcpheal gives
  its agent a session (six session checks pass only through mcpheal).
- The held route passes every check the server of both eras passes but two: the suite wants the input
  request under the tool's own key (`user_name`); a session-era server sends `elicitation/create`, which
  names none, and mcpheal names it `mcpheal-1` (docs/eras.md "What the session era cannot carry").
- The bridge passes every check the server of both eras passes but `server-sse-retry-field` (a SHOULD, not
  scored): a 2026-07-28 server sends no SSE `retry:`, and the bridge invents none.
- Client mode: every check as directly but `resource-parameter-matches-prm` (7 auth scenarios), by design:
  an agent that logs in through mcpheal names mcpheal as the resource (docs/oauth.md).
TAIL
} > bench/conformance.md
echo "wrote bench/conformance.md"
