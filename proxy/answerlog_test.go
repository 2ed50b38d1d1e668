package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// agentResumeStub is a stub whose tools/call answer sends one event (no
// id: the server keeps no events), waits for release, then sends the
// result.
func agentResumeStub(t *testing.T, st *resumeStub, release <-chan struct{}) string {
	return st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, `data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"started"}}`+"\n\n")
		<-release
		streamEvents(w, resumeResult+"\n\n")
	}, nil)
}

// readFirstEvent reads the agent's answer up to its first event's blank
// line and returns that event's id.
func readFirstEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var id string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if line == "\n" {
			return id
		}
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			id = strings.TrimSpace(v)
		}
	}
}

// TestAgentResumesFromLog: an agent's connection drops after the first
// event of a call's answer, from a server that keeps no events. The call
// goes on; the agent's GET with that event's id gets the rest of the
// answer from mcpheal's log, the result among it. The call ran once, and
// once the answer is delivered the budget is back where it was.
func TestAgentResumesFromLog(t *testing.T) {
	t.Parallel()
	var st resumeStub
	release := make(chan struct{})
	up := agentResumeStub(t, &st, release)
	s, url := startProxy(t, up, func(c *conf.Config) { c.StreamKeepalive = 20 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	before := s.mem.Used.Load()
	resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, resumeCall))
	if err != nil {
		t.Fatal(err)
	}
	id := readFirstEvent(t, bufio.NewReader(resp.Body))
	if !ownIDLine.MatchString("id: " + id + "\n") {
		t.Fatalf("first event's id %q: want mcpheal's own", id)
	}
	_ = resp.Body.Close() // the agent's connection drops mid-call
	// The keepalive comments find the connection gone; then the result comes.
	peers.Wait(t, "mcpheal to notice the agent gone", func() bool { return agentLeft(s) })
	close(release)

	got, body := resumeGet(t, url, sid, id)
	if got.StatusCode != http.StatusOK || !ownIDs(string(body), resumeResult+"\n\n") || strings.Contains(string(body), "started") {
		t.Fatalf("resume: %d %q; want the result alone, with mcpheal's id", got.StatusCode, body)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
	if ok := s.count.AgentResumes[obs.OutcomeOK].Load(); ok != 1 {
		t.Errorf("agent resumes served: %d, want 1", ok)
	}
	// The log stays for resume_window after the answer ended (another
	// resume may come); what it holds is counted until then.
	if s.mem.Used.Load() <= before {
		t.Errorf("memory_budget used %d, %d before the call: the kept answer is not counted", s.mem.Used.Load(), before)
	}
}

// TestAgentNeverResumes: an agent whose connection drops mid-call and that
// never comes back leaves nothing behind: at the end of resume_window the
// call is abandoned (its upstream stream closed, nothing sent again), the
// log is forgotten, and the memory budget is back where it was.
func TestAgentNeverResumes(t *testing.T) {
	t.Parallel()
	var st resumeStub
	release := make(chan struct{})
	defer close(release)
	up := agentResumeStub(t, &st, release)
	s, url := startProxy(t, up, func(c *conf.Config) {
		c.StreamKeepalive = 20 * time.Millisecond
		c.ResumeWindow = 200 * time.Millisecond
	})
	sid := peers.RawInitialize(t, url)
	before := s.mem.Used.Load()
	resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, resumeCall))
	if err != nil {
		t.Fatal(err)
	}
	readFirstEvent(t, bufio.NewReader(resp.Body))
	_ = resp.Body.Close()
	peers.Wait(t, "the log to be forgotten", func() bool {
		s.answers.Mu.Lock()
		defer s.answers.Mu.Unlock()
		return len(s.answers.M) == 0
	})
	peers.Wait(t, "the memory budget to be back", func() bool { return s.mem.Used.Load() == before })
	// A late resume finds nothing: an empty stream, as for a dead session's.
	got, body := resumeGet(t, url, sid, "m1-1")
	if got.StatusCode != http.StatusOK || len(body) != 0 {
		t.Fatalf("late resume: %d %q; want an empty event stream", got.StatusCode, body)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
}

// TestAnswerLogKeepsTheTail: a log keeps the last resume_buffer bytes of an
// answer, whatever the sizes of the pieces it is given: events that ended
// within them are served whole from the one after the agent's, while a
// resume from further back is lost; memory_budget is charged per chunk kept
// and given back when the log is dropped.
func TestAnswerLogKeepsTheTail(t *testing.T) {
	t.Parallel()
	var mem wire.Budget
	mem.Limit = 1 << 30
	ls := &exchange.AnswerLogs{}
	l := &exchange.AnswerLog{Key: "m1", Ls: ls, Mem: &mem, Max: 2 * exchange.LogChunk, Window: time.Minute, Wake: make(chan struct{})}
	ls.M = map[string]*exchange.AnswerLog{"m1": l}
	event := func(i int) string { // about 20 KiB each, one ending in CRLFs
		end := "\n\n"
		if i%7 == 3 {
			end = "\r\n\r\n"
		}
		return ": c\ndata: " + strings.Repeat(string(rune('a'+i%26)), 20<<10) + " " + strconv.Itoa(i) + end
	}
	var all strings.Builder
	for i := 1; i <= 40; i++ {
		all.WriteString(event(i))
	}
	in := all.String()
	for pos, step := 0, 1; pos < len(in); pos, step = pos+step, step*3%9973+1 {
		l.Append([]byte(in[pos:min(pos+step, len(in))]))
	}
	if got := mem.Used.Load(); got != int64(len(l.Chunks))*exchange.LogChunk || len(l.Chunks) > 3 {
		t.Fatalf("budget used %d for %d chunks (want at most 3, charged 64 KiB each)", got, len(l.Chunks))
	}
	want := ""
	for i := 37; i <= 40; i++ {
		want += event(i)
	}
	got, next, _, _, lost := l.Since(nil, 36)
	if lost || next != 40 || string(got) != want {
		t.Fatalf("since 36: %d bytes, next %d, lost %v; want events 37-40 (%d bytes)", len(got), next, lost, len(want))
	}
	if _, _, _, end, lost := l.Since(nil, 5); !lost || !end {
		t.Fatalf("since 5: lost %v, end %v; want it lost: the log keeps the last %d bytes", lost, end, l.Max)
	}
	// An event larger than what is kept is not copied at all; the events
	// after it are kept as usual.
	before := mem.Used.Load()
	big := "data: " + strings.Repeat("z", 5*exchange.LogChunk) + "\n\n"
	for i := 0; i < len(big); i += 1000 {
		l.Append([]byte(big[i:min(i+1000, len(big))]))
		if used := mem.Used.Load(); used > before {
			t.Fatalf("at %d of a %d-byte event: budget used %d, was %d; want nothing copied", i, len(big), used, before)
		}
	}
	l.Append([]byte(event(42)))
	if got, next, _, _, lost := l.Since(nil, 41); lost || next != 42 || string(got) != event(42) {
		t.Fatalf("since the large event: %d bytes, next %d, lost %v; want event 42", len(got), next, lost)
	}
	if _, _, _, _, lost := l.Since(nil, 40); !lost {
		t.Fatal("since 40: want it lost (the large event after it was not kept)")
	}
	l.Finish() // the agent never left: nothing to keep
	if mem.Used.Load() != 0 || len(ls.M) != 0 {
		t.Fatalf("after finish: budget used %d, %d logs kept; want 0 and 0", mem.Used.Load(), len(ls.M))
	}
}

// TestAgentResumeAtAnotherReplica: without a shared store a log is its
// process's own (with one, sharedanswers_test.go). An agent whose resume
// reaches another replica (the same session keys: it serves the session)
// gets an empty event stream, as for a stream of a dead session: its SDK
// then sees the call's stream end without an answer. The replica that
// holds the log keeps the call going for the window.
func TestAgentResumeAtAnotherReplica(t *testing.T) {
	t.Parallel()
	var st resumeStub
	release := make(chan struct{})
	defer close(release)
	up := agentResumeStub(t, &st, release)
	keys := testKeys(1)
	mod := func(c *conf.Config) { c.SessionKeys = keys; c.StreamKeepalive = 20 * time.Millisecond }
	_, urlA := startProxy(t, up, mod)
	b, urlB := startProxy(t, up, mod)
	sid := peers.RawInitialize(t, urlA)
	resp, err := peers.RawClient.Do(peers.PostRequest(t, urlA, sid, resumeCall))
	if err != nil {
		t.Fatal(err)
	}
	id := readFirstEvent(t, bufio.NewReader(resp.Body))
	_ = resp.Body.Close()

	got, body := resumeGet(t, urlB, sid, id)
	if got.StatusCode != http.StatusOK || !strings.HasPrefix(got.Header.Get("Content-Type"), "text/event-stream") || len(body) != 0 {
		t.Fatalf("resume at another replica: %d %q %q; want an empty event stream", got.StatusCode, got.Header.Get("Content-Type"), body)
	}
	if n := b.count.AgentResumes[obs.OutcomeOK].Load(); n != 0 {
		t.Errorf("the other replica served %d resumes from a log it does not have", n)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
}

// resumeGet sends the GET with which an agent resumes the answer whose
// event lastEventID it got last, and returns the whole answer.
func resumeGet(t *testing.T, url, sid, lastEventID string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Last-Event-ID", lastEventID)
	return peers.RawDo(t, req)
}

// TestAgentLeavesAnEndlessLine: an agent that drops in the middle of an
// event larger than resume_buffer (here a data line that never ends) could
// never resume it: mcpheal stops reading the call at once and closes it
// upstream, instead of reading it on for resume_window.
func TestAgentLeavesAnEndlessLine(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	up := startStub(t, nil, func(w http.ResponseWriter, r *http.Request, method string) {
		if method != "tools/call" {
			http.Error(w, "Bad Request: Server not initialized", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "id: 1\ndata: ")
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				close(closed)
				return
			}
			_ = http.NewResponseController(w).Flush()
		}
	})
	_, url := startProxy(t, up, func(c *conf.Config) {
		c.ResumeBuffer = 1 << 20
		c.ResumeWindow = time.Minute
	})
	sid := peers.RawInitialize(t, url)
	resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"endless","arguments":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 2<<20)); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream still writes the endless line 10 s after the agent left (resume_window is a minute)")
	}
}
