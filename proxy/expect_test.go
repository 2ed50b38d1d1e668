package proxy

import (
	"bufio"
	"fmt"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestExpectContinueNoDesync: an agent's Expect: 100-continue is not
// forwarded, and an upstream's interim answer is not taken for the answer
// (that pooled the connection with the real answer unread, and another
// agent received it).
func TestExpectContinueNoDesync(t *testing.T) {
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sidA := peers.RawInitialize(t, url)
	sidB := peers.RawInitialize(t, url)
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"lookup","arguments":{"q":"SECRET-OF-A"}}}`
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nMCP-Protocol-Version: 2025-11-25\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", host, sidA, len(body))
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, _ := br.ReadString('\n')
	if strings.Contains(line, "100") { // fasthttp's own 100 Continue to the agent
		for l, _ := br.ReadString('\n'); l != "\r\n" && l != ""; l, _ = br.ReadString('\n') {
		}
	}
	io.WriteString(c, body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("agent A: %v (first line %q)", err, line)
	}
	ba, _ := io.ReadAll(resp.Body)
	t.Logf("agent A got %d %q", resp.StatusCode, ba)
	_, ans := callTool(t, url, sidB, "lookup")
	t.Logf("agent B got %s", ans.Raw)
	if strings.Contains(ans.Raw, "SECRET-OF-A") {
		t.Fatal("agent B received agent A's answer: the upstream connection was pooled mid-response after a 100 Continue")
	}
}
