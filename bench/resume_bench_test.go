package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy"
)

// dropUpstream answers every tools/call with an SSE answer of about 1 MiB:
// 16 progress notifications of 64 KiB each, 5 ms apart, then the result.
// It counts the answers it wrote to their end (completed).
type dropUpstream struct {
	completed atomic.Int64
}

func (d *dropUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch {
	case strings.Contains(string(body), `"initialize"`):
		w.Header().Set("Mcp-Session-Id", "drop-session")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(fakeInit)
		return
	case !strings.Contains(string(body), `"tools/call"`):
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	chunk := strings.Repeat("p", 64<<10)
	for i := 1; i <= 16; i++ {
		if _, err := fmt.Fprintf(w, `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":%d,"message":"%s"}}`+"\n\n", i, chunk); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := io.WriteString(w, `data: {"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n\n"); err == nil {
		d.completed.Add(1)
	}
}

// dropAgent initializes a session through the proxy at url, calls the tool
// and drops its connection after the answer's first event.
func dropAgent(hc *http.Client, url string) error {
	post := func(sid, body string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		return hc.Do(req)
	}
	resp, err := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"drop","version":"1"}}}`)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		return fmt.Errorf("initialize: %d", resp.StatusCode)
	}
	resp, err = post(sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"big","arguments":{}}}`)
	if err != nil {
		return err
	}
	defer resp.Body.Close() // mid-answer: the connection is closed, not reused
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return fmt.Errorf("first event: %w", err)
		}
		if line == "\n" {
			return nil
		}
	}
}

// dropRun sends agents agents through a proxy configured by mod, each
// dropping mid-answer, and returns the peak Go heap in use while they do
// and the answers finished, how many answers the upstream completed, and
// how many agents failed before their first event (a memory_budget too
// small for their sessions).
func dropRun(tb testing.TB, agents int, mod func(*proxy.Config)) (peakMB float64, completed, failed int64) {
	up := &dropUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := startProxyWith(tb, "http://"+ln.Addr().String()+"/mcp", mod)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: agents, MaxConnsPerHost: 0}}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	var fails atomic.Int64
	for range agents {
		wg.Go(func() {
			if err := dropAgent(hc, url); err != nil {
				fails.Add(1)
			}
		})
	}
	wg.Wait()
	// The answers go on upstream for the resume window (or end at once with
	// resumption off): give them 16 × 5 ms and the window's end.
	time.Sleep(time.Second)
	close(stop)
	<-sampled
	if n := fails.Load(); n == int64(agents) {
		tb.Fatalf("all %d agents failed", n)
	}
	return float64(peak.Load()-base) / (1 << 20), up.completed.Load(), fails.Load()
}

// BenchmarkAgentsDropMidAnswer: 1 000 agents each call a tool whose answer
// is about 1 MiB in 16 events over 80 ms, and drop their connection after
// its first event; none comes back. With resumption on (resume_buffer
// 4 MiB, memory_budget 512 MiB, resume_window 500 ms here) the calls go on
// and their answers are kept for the agents, within the budget; with it
// off (resume_window off) each call is abandoned as its agent goes; with
// memory_budget at 64 MiB the answers past it are not kept, and their calls
// are abandoned as without resumption. It
// reports the peak of the Go heap in use above where it started
// (peak-heap-MB: client, upstream and proxy in one process), how many
// answers the upstream wrote to their end (completed), and how many agents
// mcpheal refused a session or an answer for lack of budget (refused).
func BenchmarkAgentsDropMidAnswer(b *testing.B) {
	for _, c := range []struct {
		name   string
		window time.Duration
		budget int
	}{{"resume", 500 * time.Millisecond, 0}, {"resume-budget-64MiB", 500 * time.Millisecond, 64 << 20}, {"off", -1, 0}} {
		b.Run(c.name, func(b *testing.B) {
			var peak float64
			var completed, failed int64
			for range b.N {
				p, n, f := dropRun(b, 1000, func(cfg *proxy.Config) { cfg.ResumeWindow, cfg.MemoryBudget = c.window, c.budget })
				peak, completed, failed = max(peak, p), completed+n, failed+f
			}
			b.ReportMetric(peak, "peak-heap-MB")
			b.ReportMetric(float64(completed)/float64(b.N), "completed")
			b.ReportMetric(float64(failed)/float64(b.N), "refused")
		})
	}
}

// TestAgentsDropMidAnswerSetup runs the benchmark's plumbing with 20
// agents, so that it is tested in CI: with resumption on, every call runs
// to its end for its agent; off, they are abandoned.
func TestAgentsDropMidAnswerSetup(t *testing.T) {
	t.Parallel()
	if _, n, f := dropRun(t, 20, nil); n != 20 || f != 0 {
		t.Errorf("resumption on: the upstream completed %d of 20 answers (%d agents refused), want 20", n, f)
	}
	if _, n, _ := dropRun(t, 20, func(c *proxy.Config) { c.ResumeWindow = -1 }); n == 20 {
		t.Errorf("resumption off: the upstream completed all 20 answers; want them abandoned as their agents went")
	}
}
