//go:build unix

package interop

// The servers of the conformance table (conformance_table_test.go), each a
// real server configured by its own SDK's options:
//
//   - the Go SDK 1.8.0 conformance everything-server (the module cache's,
//     at the go-sdk version go.mod requires), serving both eras (its
//     default: stateless), the session era only (with sessions, and
//     ServerOptions.SupportedProtocolVersions naming the session-era
//     versions) or 2026-07-28 only (SupportedProtocolVersions naming it
//     alone). Its main.go has no flag for SupportedProtocolVersions, so
//     buildGoEverything builds its source with one added (-versions),
//     through a build overlay: the rest of the program is the SDK's,
//     unchanged;
//   - the TypeScript SDK v1 (1.32.2): testdata/v1everything.mjs, the
//     suite's own everything-server for it, serving the session era only;
//   - the TypeScript SDK v2 (2.4.0): testdata/v2everything.mjs, the SDK's
//     own conformance everything-server, serving both eras (with sessions)
//     or 2026-07-28 only (legacy: 'reject');
//   - the Python SDK 2.3 MCPServer (testdata/python/server.py mcpserver),
//     both eras: its tools are not the suite's, so only the scenarios that
//     need none of them can pass, directly and through mcpheal alike.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// The protocol versions the Go SDK 1.8.0 serves: the session era's, and
// 2026-07-28.
var (
	goSessionEraVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}
	go2026Versions       = []string{revision2026}
)

// everythingOptionsLine is the line of the everything-server's main.go
// that builds its ServerOptions; the overlay adds
// SupportedProtocolVersions to it.
const everythingOptionsLine = "\topts := &mcp.ServerOptions{\n"

// everythingVersionsFile is the file the overlay adds to the
// everything-server's package: the -versions flag.
const everythingVersionsFile = `package main

import (
	"flag"
	"strings"
)

var versions = flag.String("versions", "", "comma-separated protocol versions to serve (ServerOptions.SupportedProtocolVersions); empty: the SDK's own")

// supportedVersions is the -versions flag as ServerOptions wants it.
func supportedVersions() []string {
	if *versions == "" {
		return nil
	}
	return strings.Split(*versions, ",")
}
`

// buildGoEverything builds the Go SDK's conformance everything-server with
// a -versions flag (ServerOptions.SupportedProtocolVersions, comma-separated)
// and returns the binary's path.
func buildGoEverything(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	const pkg = "github.com/modelcontextprotocol/go-sdk/conformance/everything-server"
	out, err := exec.Command(gobin, "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	src := strings.TrimSpace(string(out))
	main, err := os.ReadFile(filepath.Join(src, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(main), everythingOptionsLine); n != 1 {
		t.Fatalf("the everything-server's main.go (%s) has %d lines %q, want 1: the overlay that adds -versions needs updating for this go-sdk", src, n, everythingOptionsLine)
	}
	patched := strings.Replace(string(main), everythingOptionsLine, everythingOptionsLine+"\t\tSupportedProtocolVersions: supportedVersions(),\n", 1)
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The overlay may not replace files of the module cache: the program is
	// built as a package of this module's that exists only in the overlay
	// (testdata/goeverything), which resolves its imports with go.mod as the
	// SDK's own conformance programs do (buildGoSDK).
	virtual, err := filepath.Abs(filepath.Join("testdata", "goeverything"))
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := json.Marshal(map[string]any{"Replace": map[string]string{
		filepath.Join(virtual, "main.go"):     write("main.go", patched),
		filepath.Join(virtual, "versions.go"): write("versions.go", everythingVersionsFile),
	}})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "everything-server")
	build := exec.Command(gobin, "build", "-overlay", write("overlay.json", string(overlay)), "-o", bin, "./testdata/goeverything")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go SDK everything-server with -versions: %v\n%s", err, out)
	}
	return bin
}

// startGoEverything serves the everything-server bin (buildGoEverything)
// limited to versions (nil: the SDK's own), stateless or with sessions.
func startGoEverything(t *testing.T, bin string, versions []string, stateless bool) string {
	t.Helper()
	return startEverythingBinary(t, bin, "-versions", strings.Join(versions, ","), "-stateless="+strconv.FormatBool(stateless))
}

// startV1Everything serves testdata/v1everything.mjs (the TypeScript SDK
// v1, the session era only) and returns its MCP URL.
func startV1Everything(t *testing.T) string {
	t.Helper()
	return startServer(t, "v1everything", 0, nil, "v1everything.mjs").url()
}

// startV2Everything serves testdata/v2everything.mjs (the TypeScript SDK
// v2) with legacy "sessions" (both eras) or "reject" (2026-07-28 only) and
// returns its MCP URL.
func startV2Everything(t *testing.T, legacy string) string {
	t.Helper()
	return startServer(t, "v2everything-"+legacy, 0, []string{"LEGACY=" + legacy}, "v2everything.mjs").url()
}
