package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestIdleAnswerKeptAlive: a call that sends one event and then nothing for
// 1.2 s, behind a relay between the agent and mcpheal that closes
// connections idle for 400 ms (a load balancer's idle timeout). With
// stream_keepalive at 100 ms the agent's answer gets ": keepalive"
// comments, the relay never finds it idle, and the agent gets the result;
// with stream_keepalive at 5 s the relay cuts the answer, so the comments
// are what kept it.
func TestIdleAnswerKeptAlive(t *testing.T) {
	t.Parallel()
	for _, every := range []time.Duration{100 * time.Millisecond, 5 * time.Second} {
		t.Run(every.String(), func(t *testing.T) {
			t.Parallel()
			var st resumeStub
			up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
				streamEvents(w, `data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"started"}}`+"\n\n")
				time.Sleep(1200 * time.Millisecond)
				streamEvents(w, resumeResult+"\n\n")
			}, nil)
			_, url := startProxy(t, up, func(c *Config) { c.StreamKeepalive = every })
			relay := newTCPRelay(t, strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp"))
			relay.CloseIdle(400 * time.Millisecond)
			sid := peerRawInitialize(t, relay.URL())
			req := peerPostRequest(t, relay.URL(), sid, resumeCall)
			resp, err := peerRawClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body strings.Builder
			_, rerr := io.Copy(&body, resp.Body)
			got := body.String()
			if every > time.Second {
				if rerr == nil && strings.Contains(got, resumeResult) || relay.IdleClosed() == 0 {
					t.Fatalf("without comments the relay closed %d connections and the agent got %q (%v); want the answer cut", relay.IdleClosed(), got, rerr)
				}
				return
			}
			if rerr != nil || !strings.Contains(got, resumeResult) {
				t.Fatalf("answer: %v, %q; want the result", rerr, got)
			}
			if n := strings.Count(got, ": keepalive\n"); n < 5 {
				t.Errorf("answer has %d keepalive comments in 1.2 s at 100 ms; want at least 5:\n%s", n, got)
			}
			if n := relay.IdleClosed(); n != 0 {
				t.Errorf("the relay closed %d idle connections, want 0", n)
			}
			if n := st.posts.Load(); n != 1 {
				t.Errorf("the upstream got the call %d times, want 1", n)
			}
		})
	}
}
