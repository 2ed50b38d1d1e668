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
