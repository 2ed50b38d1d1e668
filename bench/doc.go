// Package bench measures mcpheal against a direct connection and nginx
// (and, in the -peers leg of bench/run.sh, IBM ContextForge).
//
// It holds what the harness (bench/cmd/mcpbench) and the micro-benchmarks
// share: the benchmark upstream (the official Go SDK's Streamable HTTP
// server with one echo tool, JSON or SSE answers), a stub upstream for the
// memory run, a minimal MCP client that opens sessions, and the check that an
// answer really holds the echo of the request it answers.
//
// The package must not depend on the harness's tools (vegeta, nginx): those
// live in the harness and in the separate module bench/tools, so that
// `go test ./...` covers this package with nothing installed.
//
// Invariant: every load request carries a JSON-RPC id unique within its
// session, and its echo text names that id, so that CheckEcho can prove
// that each answer is the echo of the request that carries its id.
package bench
