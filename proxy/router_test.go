package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// startRouter serves ups on a 127.0.0.1 port and returns the router and its
// base URL.
func startRouter(t *testing.T, ups []conf.Config) (*Router, string) {
	t.Helper()
	r, base, _, _ := startRouterAdmin(t, ups)
	return r, base
}

// startRouterAdmin is startRouter that also serves the admin listener on
// another 127.0.0.1 port, and returns its base URL and the router's log.
func startRouterAdmin(t *testing.T, ups []conf.Config) (r *Router, base, admin string, logs *testLog) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for i := range ups {
		ups[i].AdminListen = aln.Addr().String()
	}
	logs = &testLog{t: t}
	r, err = NewRouter(ln.Addr().String(), ups, zeroLog(logs))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { r.Serve(ln); done <- struct{}{} }()
	go func() { r.ServeAdmin(aln); done <- struct{}{} }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r.Shutdown(ctx)
		<-done
		<-done
		if t.Failed() {
			t.Logf("router log:\n%s", logs.String())
		}
	})
	return r, "http://" + ln.Addr().String(), "http://" + aln.Addr().String(), logs
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRouterTwoUpstreams: two upstreams in one process, each at its path,
// each healing on its own.
func TestRouterTwoUpstreams(t *testing.T) {
	t.Parallel()
	a, b := peers.StartGoSDK(t, peers.GoSDKOpts{}), peers.StartMCPGo(t, true)
	_, base := startRouter(t, []conf.Config{
		{Name: "a", Upstream: a.URL(), Path: "/a/mcp"},
		{Name: "b", Upstream: b.URL(), Path: "/b/mcp"},
	})
	peers.CallEcho(t, peers.GoSDKClient(t, base+"/a/mcp"), "to a")
	peers.McpGoCallEcho(t, peers.McpGoClient(t, base+"/b/mcp"), "to b")
	if a.Calls("tools/call") != 1 || b.Calls("tools/call") != 1 {
		t.Fatalf("tools/call reached a %d, b %d times; want 1 each", a.Calls("tools/call"), b.Calls("tools/call"))
	}
	if code, _ := get(t, base+"/c/mcp"); code != 404 {
		t.Fatalf("unknown path: %d", code)
	}
}

// TestReadyz: on the admin listener, ready while every upstream is
// reachable; 503 naming the one that is down.
func TestReadyz(t *testing.T) {
	t.Parallel()
	a, b := peers.StartGoSDK(t, peers.GoSDKOpts{}), peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, base, admin, _ := startRouterAdmin(t, []conf.Config{{Name: "alpha", Upstream: a.URL(), Path: "/a/mcp"}, {Name: "beta", Upstream: b.URL(), Path: "/b/mcp"}})
	if code, body := get(t, admin+"/readyz"); code != 200 {
		t.Fatalf("readyz: %d %q", code, body)
	}
	for _, u := range []string{base + "/healthz", admin + "/healthz"} {
		if code, _ := get(t, u); code != 200 {
			t.Fatalf("%s: %d", u, code)
		}
	}
	b.Stop()
	peers.Wait(t, "readyz to notice", func() bool {
		code, body := get(t, admin+"/readyz")
		return code == 503 && strings.Contains(body, "beta") && !strings.Contains(body, "alpha")
	})
}

// TestMetricsAfterHeal scrapes /metrics, parses it, and sees the heal and
// the requests counted.
func TestMetricsAfterHeal(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, base, admin, _ := startRouterAdmin(t, []conf.Config{{Name: "gosdk", Upstream: up.URL(), Path: "/mcp"}})
	sid := peers.RawInitialize(t, base+"/mcp")
	call := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"m"}}}`
	peers.RawPost(t, base+"/mcp", sid, call)
	up.ExpireSessions()
	if resp, body := peers.RawPost(t, base+"/mcp", sid, call); resp.StatusCode != 200 {
		t.Fatalf("call after expiry: %d %q", resp.StatusCode, body)
	}
	code, text := get(t, admin+"/metrics")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, text)
	}
	value := func(name string, labels map[string]string) float64 {
		f := families[name]
		if f == nil {
			t.Fatalf("no %s in\n%s", name, text)
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"mcpheal_heals_total", map[string]string{"upstream": "gosdk", "reason": "session_gone", "outcome": "ok"}, 1},
		{"mcpheal_requests_total", map[string]string{"upstream": "gosdk", "method": "tools/call", "class": "OK"}, 2},
		{"mcpheal_classified_total", map[string]string{"upstream": "gosdk", "class": "SessionGone"}, 1},
		{"mcpheal_replays_total", map[string]string{"upstream": "gosdk", "outcome": "done"}, 1},
		{"mcpheal_heal_duration_seconds", map[string]string{"upstream": "gosdk"}, 1},
		{"mcpheal_upstream_session_age_seconds", map[string]string{"upstream": "gosdk"}, 1},
		{"mcpheal_sessions", map[string]string{"upstream": "gosdk"}, 1},
		{"mcpheal_upstream_initializes_total", map[string]string{"upstream": "gosdk"}, 2},
	}
	for _, c := range checks {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if !strings.Contains(text, `le="0.05"`) {
		t.Error("histograms lack standard le buckets")
	}
}

// TestRouterReload: new upstreams appear, removed ones stop taking requests,
// changed ones keep their existing sessions; a bad set is refused and the
// old one keeps serving.
func TestRouterReload(t *testing.T) {
	t.Parallel()
	a, b := peers.StartGoSDK(t, peers.GoSDKOpts{}), peers.StartGoSDK(t, peers.GoSDKOpts{})
	r, base := startRouter(t, []conf.Config{{Name: "a", Upstream: a.URL(), Path: "/a/mcp"}})
	sid := peers.RawInitialize(t, base+"/a/mcp")
	if err := r.Reload([]conf.Config{{Name: "a", Upstream: a.URL(), Path: "/a/mcp"}, {Name: "a", Upstream: b.URL(), Path: "/x/mcp"}}); err == nil {
		t.Fatal("duplicate names accepted")
	}
	if err := r.Reload([]conf.Config{{Name: "a", Upstream: a.URL(), Path: "/a/mcp", HealTimeout: 3 * time.Second},
		{Name: "b", Upstream: b.URL(), Path: "/b/mcp"}}); err != nil {
		t.Fatal(err)
	}
	ping := `{"jsonrpc":"2.0","id":3,"method":"ping"}`
	if resp, body := peers.RawPost(t, base+"/a/mcp", sid, ping); resp.StatusCode != 200 {
		t.Fatalf("session of a changed upstream after reload: %d %q", resp.StatusCode, body)
	}
	peers.RawInitialize(t, base+"/b/mcp")
	if err := r.Reload([]conf.Config{{Name: "b", Upstream: b.URL(), Path: "/b/mcp"}}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := peers.RawPost(t, base+"/a/mcp", sid, ping); resp.StatusCode != 404 {
		t.Fatalf("removed upstream still answers %d", resp.StatusCode)
	}
	peers.Wait(t, "the removed upstream's session to be DELETEd", func() bool {
		return hasDelete(a)
	})
}

func hasDelete(p *peers.Server) bool {
	for _, r := range p.Requests() {
		if r.HTTPMethod == http.MethodDelete {
			return true
		}
	}
	return false
}

// TestShutdownWithRequestInFlight: a request in flight when shutdown starts
// completes; the upstream sessions are DELETEd.
func TestShutdownWithRequestInFlight(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(ln.Addr().String(), []conf.Config{{Name: "a", Upstream: up.URL(), Path: "/mcp"}}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	go r.Serve(ln)
	url := "http://" + ln.Addr().String() + "/mcp"
	sid := peers.RawInitialize(t, url)
	done := make(chan string, 1)
	go func() {
		resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"slow","arguments":{"steps":2,"delayMs":200}}}`)
		done <- resp.Status + " " + string(body)
	}()
	peers.Wait(t, "the slow call to start", func() bool { return up.ToolCalls("slow") == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := <-done; !strings.Contains(got, "done") {
		t.Fatalf("in-flight call: %s", got)
	}
	if !hasDelete(up) {
		t.Fatal("shutdown did not DELETE the upstream session")
	}
}

// TestAdminFor: an admin address left unset is the agent listener's host
// at the next port, so that two processes on one host with different
// listen addresses get different admin addresses.
func TestAdminFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ listen, want string }{
		{"127.0.0.1:8787", "127.0.0.1:8788"},
		{"127.0.0.1:9000", "127.0.0.1:9001"},
		{"0.0.0.0:8787", "127.0.0.1:8788"},
		{"10.1.2.3:9000", "127.0.0.1:9001"},
		{"[::1]:8787", "[::1]:8788"},
		{"127.0.0.1:0", "127.0.0.1:0"},
		{"127.0.0.1:65535", "127.0.0.1:0"},
	} {
		if got := conf.AdminFor(c.listen); got != c.want {
			t.Errorf("AdminFor(%q) = %q, want %q", c.listen, got, c.want)
		}
	}
	if d := conf.Defaults(); d.AdminListen != "127.0.0.1:8788" {
		t.Errorf("Defaults().AdminListen = %q, want 127.0.0.1:8788", d.AdminListen)
	}
}
