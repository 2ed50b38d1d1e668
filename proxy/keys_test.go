package proxy

import (
	"testing"
	"time"
)

// TestEscapedKeysAreDuplicates and the tests below: mcpheal reads routed
// members as servers do (escapes decoded, case folded as Go's encoding/json
// does), so a member that appears twice in any spelling is refused.
func TestEscapedKeysAreDuplicates(t *testing.T) {
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","na\u006de":"charge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","m\u0065thod":"tools/call","params":{"name":"charge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup"},"p\u0061rams":{"name":"charge"}}`,
	} {
		m := parseMessage([]byte(b))
		t.Logf("%s -> method=%q tool=%q dup=%v", b, m.method, m.tool, m.dup)
	}
}

func TestCaseVariantKeysAreDuplicates(t *testing.T) {
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","NAME":"charge"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"charge"}}`,
	} {
		m := parseMessage([]byte(b))
		t.Logf("%s -> method=%q tool=%q dup=%v", b, m.method, m.tool, m.dup)
	}
}

func TestCaseVariantMethodRefused(t *testing.T) {
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), func(c *Config) { c.HealTimeout = 300 * time.Millisecond })
	sid := peerRawInitialize(t, url)
	resp, raw := peerRawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"ping","Method":"tools/call","params":{"name":"crash_tool","arguments":{}}}`)
	t.Logf("agent got %d %s", resp.StatusCode, raw)
	if n := up.Runs("crash_tool"); n > 1 {
		t.Fatalf("crash_tool ran %d times", n)
	}
}
