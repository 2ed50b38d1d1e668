package classify

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkClassify runs one representative answer per class, named
// <Class>/<shape>. Each is a golden file, so the numbers track real bytes.
func BenchmarkClassify(b *testing.B) {
	big := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` +
		strings.Repeat(`line with \"quotes\" and text\n`, 128) + `"}],"isError":false}}`
	for _, bc := range []struct {
		name, file string // file under testdata, or "" for the inline body
		status     int
		ct, body   string
	}{
		{name: "OK/json", file: "OK/ts-sdk-200-json-tools-list"},
		{name: "OK/json-4KiB-isError-false", status: 200, ct: "application/json", body: big},
		{name: "OK/sse", file: "OK/ts-sdk-200-sse-priming-then-result"},
		{name: "OK/sse-4KiB", status: 200, ct: "text/event-stream", body: "id: 1\ndata: \n\nevent: message\nid: 2\ndata: " + big + "\n\n"},
		{name: "OK/202-empty", file: "OK/accepted-202-empty"},
		{name: "ToolError/json", file: "ToolError/method-not-found-200"},
		{name: "ToolError/404-method-not-found", file: "ToolError/spec-2026-404-method-not-found"},
		{name: "SessionGone/404-text", file: "SessionGone/go-sdk-404-session-not-found"},
		{name: "SessionGone/400-json", file: "SessionGone/ts-example-400-no-valid-session-id"},
		{name: "SessionGone/200-json-marker", file: "SessionGone/wordpress-200-invalid-or-expired-session"},
		{name: "SessionGone/sse", file: "SessionGone/sse-priming-then-session-error"},
		{name: "Auth", file: "Auth/go-sdk-403-session-user-mismatch"},
		{name: "Protocol", file: "Protocol/ts-sdk-400-unsupported-protocol-version"},
		{name: "TransportDead", file: "TransportDead/supergateway-4-503-shutting-down"},
	} {
		status, ct, body := bc.status, []byte(bc.ct), []byte(bc.body)
		if bc.file != "" {
			raw, err := os.ReadFile(filepath.Join("testdata", bc.file+".http"))
			if err != nil {
				b.Fatal(err)
			}
			if status, ct, body, err = parseResponse(raw); err != nil {
				b.Fatal(err)
			}
		}
		want, _ := classNamed(strings.SplitN(bc.name, "/", 2)[0])
		if got := Classify(status, ct, body); got != want {
			b.Fatalf("Classify(%s) = %v, want %v", bc.name, got, want)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				Classify(status, ct, body)
			}
		})
	}
}

// BenchmarkRefused runs one proof and two non-proofs, each a golden file.
func BenchmarkRefused(b *testing.B) {
	for _, bc := range []struct{ name, file string }{
		{"true/supergateway-text", "true/supergateway-4-503-shutting-down"},
		{"true/python-json", "true/python-503-too-many-open-sessions-json"},
		{"false/envoy", "false/envoy-503-upstream-connect-error"},
		{"false/nginx-503", "false/nginx-503-service-temporarily-unavailable"},
	} {
		raw, err := os.ReadFile(filepath.Join("testdata", "refused", bc.file+".http"))
		if err != nil {
			b.Fatal(err)
		}
		status, ct, body, err := parseResponse(raw)
		if err != nil {
			b.Fatal(err)
		}
		want := strings.HasPrefix(bc.name, "true/")
		if got := Refused(status, ct, body); got != want {
			b.Fatalf("Refused(%s) = %v, want %v", bc.name, got, want)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				Refused(status, ct, body)
			}
		})
	}
}
