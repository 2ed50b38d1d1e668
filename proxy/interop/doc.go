// Package interop runs real MCP clients and servers from npm (software nobody
// here wrote) through mcpheal and checks that the agent sees what it sees
// without mcpheal, plus the heals only mcpheal gives. It has no code of its
// own: everything is in its tests.
//
// The fixtures live in testdata/: package.json pins every npm package
// exactly, package-lock.json is committed, and TestMain runs `npm ci` there
// when node_modules is missing or stale (CI runs it before `go test`). The
// tests need `node` (20 or later) and `npm` on PATH and fail, never skip,
// without them.
//
// Every process a test starts listens on 127.0.0.1 only, lives in its own
// process group (killed in cleanup), and also exits by itself when its stdin
// closes or after a few minutes (testdata/guard.mjs).
package interop
