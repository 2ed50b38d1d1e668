// Package interop runs real MCP clients and servers from npm and PyPI
// (software nobody here wrote) through mcpheal and checks that the agent sees
// what it sees without mcpheal, plus the heals only mcpheal gives. It has no
// code of its own: everything is in its tests.
//
// The npm fixtures live in testdata/: package.json pins every npm package
// exactly, package-lock.json is committed, and TestMain runs `npm ci` there
// when node_modules is missing or stale (CI runs it before `go test`). The
// Python fixtures live in testdata/python/: two virtual environments of
// hash-locked packages (hermes.txt: Hermes Agent and the mcp 1.26 SDK under
// it; sdk.txt: the mcp 2.3 SDK and FastMCP), which setup.sh builds and
// TestMain runs when a venv is missing or was built from another lock file
// (CI runs it before `go test` too). The tests need `node` (20 or later),
// `npm` and `python3.11` on PATH and fail, never skip, without them.
//
// Every process a test starts listens on 127.0.0.1 only, lives in its own
// process group (killed in cleanup), and also exits by itself when its stdin
// closes or once go test's deadline (-timeout) is past (testdata/guard.mjs,
// testdata/python/guard.py).
package interop
