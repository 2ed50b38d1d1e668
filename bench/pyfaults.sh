#!/usr/bin/env bash
# Runs the whole fault matrix (TestPyOutage and TestPyFaults in
# proxy/interop/pyfaults_test.go: real MCP clients against real servers,
# each fault directly and through mcpheal, executions counted server-side)
# and writes its table to bench/pyfaults.md. About 10 minutes on a 2-core
# machine; needs python3.11, node and npm (the first run installs the pinned
# Python and npm fixtures). `go test ./...` runs every fault for Hermes and
# the Python SDK's session client, and asserts each cell; this runs every
# client and server the matrix has. The table is written even when a cell
# fails its assertions; the script then exits 1 after writing it.
set -euo pipefail
cd "$(dirname "$0")/.."
table=$(mktemp)
log=$(mktemp --suffix=.pyfaults.log)
trap 'rm -f "$table"' EXIT
status=0
MCPHEAL_PY_TABLE="$table" go test ./proxy/interop -run '^(TestPyOutage|TestPyFaults)$' -count=1 -timeout 60m -v >"$log" 2>&1 || status=$?
if [ ! -s "$table" ]; then
	tail -n 80 "$log" >&2
	echo "pyfaults.sh: the matrix wrote no table (go test exit $status)" >&2
	exit 1
fi
{
	cat <<'HEAD'
# Faults: directly and through mcpheal, judged by real clients and servers

Written by `bench/pyfaults.sh` (`TestPyOutage` and `TestPyFaults` in `proxy/interop/pyfaults_test.go`;
`go test ./...` runs every fault for Hermes and the Python SDK's session client and asserts every cell).
What each fault is, what the clients do with it and what the table shows: [docs/interop.md](../docs/interop.md).

- **Clients**: Hermes Agent 0.19.0's own MCP client (`hermes`, mcp 1.26, its `timeout: 30`, driven through
  its tool registry as its agent loop drives it), the MCP Python SDK 2.3 (`py-sdk`: one `ClientSession`, no
  reconnect of its own; `py-client-legacy`: `mcp.Client` in legacy mode; `py-client-auto`: `mcp.Client` in
  auto mode, which speaks 2026-07-28 to the Python servers), FastMCP 4.1.6's client (`fastmcp-py`, auto
  mode), the TypeScript SDK v1 and v2 clients (20 s request timeout) and `mcp-remote`.
- **Servers**: FastMCP 4.1.6 and the MCP Python SDK 2.3's MCPServer (stateful; SSE answers unless `-json`;
  `-events`: with an event store), the TypeScript SDK v1 server (an unknown session gets 400 "No valid
  session ID provided"), and the official Go SDK server in process where the fault needs a fake beside it
  (a relay that cuts a connection after the request reached the server; WordPress.com's answer to a
  forgotten session).
- **Cells**: *errors* of calls, as the model reads them (Hermes' `{"error": …}`, an SDK's exception; a
  call its session can no longer make counts); in brackets how many were in flight when the server was
  killed (nobody knows whether those ran), how many mcpheal answered `-32011` ("may or may not have run"),
  how many waited for the client's timeout; the *slowest* call; *executions*: the writes that ran of those
  asked, counted by the server, and those that ran twice.
- Every cell asserts: through mcpheal no more errors than directly (a write run twice directly counts
  as an error; calls in flight at a kill are left out on both sides), no call through mcpheal within 5 s
  of its client's timeout, no write through mcpheal run twice, and a `-32011` within 5 s.

HEAD
	cat "$table"
} >bench/pyfaults.md
echo "wrote bench/pyfaults.md"
grep -E 'pyfaults_test.go:[0-9]+: PENDING' "$log" >&2 || true
if [ "$status" -ne 0 ]; then
	grep -E '^\s+--- FAIL|pyfaults_test.go:[0-9]+: (through mcpheal|a call|PENDING)' "$log" >&2 || true
	echo "pyfaults.sh: some cells failed their assertions (go test exit $status); the table shows them; the test log: $log" >&2
	exit 1
fi
rm -f "$log"
