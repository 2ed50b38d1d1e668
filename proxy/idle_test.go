package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
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
			_, url := startProxy(t, up, func(c *conf.Config) { c.StreamKeepalive = every })
			relay := peers.NewTCPRelay(t, strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp"))
			relay.CloseIdle(400 * time.Millisecond)
			sid := peers.RawInitialize(t, relay.URL())
			req := peers.PostRequest(t, relay.URL(), sid, resumeCall)
			resp, err := peers.RawClient.Do(req)
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

// TestLongQuietCallBehindIdleTimeout: a Go SDK client calls a tool of a Go
// SDK server (with an event store, so that its answer's stream opens at once
// with a priming event) that works 90 s and sends nothing meanwhile, through
// a relay in front of the client's server that closes connections idle for
// 30 s (a load balancer's idle timeout). Through mcpheal, with
// stream_keepalive at its 15 s default, the relay never finds the answer
// idle and the call completes; directly it cuts it (the client may resume
// it from the server's event store). A server that sends nothing at all,
// not even its answer's head, cannot be kept alive by a proxy: the status is
// not known yet.
func TestLongQuietCallBehindIdleTimeout(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true})
	_, url := startProxy(t, up.URL(), nil)
	call := func(target string) (*mcp.CallToolResult, *peers.TCPRelay, error) {
		relay := peers.NewTCPRelay(t, strings.TrimSuffix(strings.TrimPrefix(target, "http://"), "/mcp"))
		relay.CloseIdle(30 * time.Second)
		cs := peers.GoSDKClient(t, relay.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: peers.SlowIn{Steps: 1, DelayMs: 90_000}})
		return res, relay, err
	}
	type outcome struct {
		res   *mcp.CallToolResult
		relay *peers.TCPRelay
		err   error
	}
	direct := make(chan outcome, 1)
	go func() {
		res, relay, err := call(up.URL())
		direct <- outcome{res, relay, err}
	}()
	res, relay, err := call(url)
	if err != nil || peers.ResultText(res) != "done" || relay.IdleClosed() != 0 {
		t.Errorf("through mcpheal: %v, %s, the relay closed %d idle connections; want done, none closed", err, peers.ResultText(res), relay.IdleClosed())
	}
	if d := <-direct; d.relay.IdleClosed() == 0 {
		t.Errorf("directly (%v, %s) the relay closed no idle connection; want it to cut the quiet call", d.err, peers.ResultText(d.res))
	}
	if n := up.ToolCalls("slow"); n != 2 {
		t.Errorf("the server ran the tool %d times, want 2 (once directly, once through mcpheal)", n)
	}
}
