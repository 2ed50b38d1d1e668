package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// Answers a fleet shares (docs/streams.md "Across replicas"), step by
// step against a scripted server, beside proxy/interop's tests with real
// clients and servers (sharedanswers_test.go there): what each replica
// writes, serves and counts.

// sharedFleet is two replicas sharing a real redis-server's store.
func sharedFleet(t *testing.T, up string) (*replicaSet, *redisstore.Store) {
	t.Helper()
	rs := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: rs.Addr, Prefix: "default", Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Keepalive comments find a dropped agent at once.
	return startFleet(t, 2, up, st, func(c *conf.Config) { c.StreamKeepalive = 20 * time.Millisecond }), st
}

// TestSharedAnswerServedElsewhere: an agent's connection to replica 0
// drops after the first event of a call whose server keeps no events; its
// GET with that event's id reaches replica 1, which serves the rest from
// the shared log as replica 0 writes it: the result, with mcpheal's id, and
// not the event the agent had. An agent of another session naming the same
// answer gets an empty stream. The call ran once; replica 0 wrote one
// answer, replica 1 served one.
func TestSharedAnswerServedElsewhere(t *testing.T) {
	t.Parallel()
	var st resumeStub
	release := make(chan struct{})
	up := agentResumeStub(t, &st, release)
	f, _ := sharedFleet(t, up)
	sid := peers.RawInitialize(t, f.replica(0))
	resp, err := peers.RawClient.Do(peers.PostRequest(t, f.replica(0), sid, resumeCall))
	if err != nil {
		t.Fatal(err)
	}
	id := readFirstEvent(t, bufio.NewReader(resp.Body))
	_ = resp.Body.Close() // the agent's connection drops mid-call
	peers.Wait(t, "replica 0 to notice the agent gone and write the answer to the shared store", func() bool {
		return agentLeft(f.procs[0].s) && f.procs[0].s.count.SharedAnswers[obs.SharedWritten].Load() == 1
	})
	// Another session's agent naming the answer gets nothing of it.
	other := peers.RawInitialize(t, f.replica(1))
	if got, body := resumeGet(t, f.replica(1), other, id); got.StatusCode != http.StatusOK || len(body) != 0 {
		t.Fatalf("another session resuming the answer: %d %q; want an empty event stream", got.StatusCode, body)
	}
	if n := f.procs[1].s.count.SharedAnswers[obs.SharedMissing].Load(); n != 1 {
		t.Errorf("replica 1 counted %d resumptions that found no answer of theirs, want 1", n)
	}
	close(release)
	got, body := resumeGet(t, f.replica(1), sid, id)
	if got.StatusCode != http.StatusOK || !ownIDs(string(body), resumeResult+"\n\n") || strings.Contains(string(body), "started") {
		t.Fatalf("resume on replica 1: %d %q; want the result alone, with mcpheal's id", got.StatusCode, body)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
	if n := f.procs[1].s.count.SharedAnswers[obs.SharedServed].Load(); n != 1 {
		t.Errorf("replica 1 served %d answers from the shared log, want 1", n)
	}
	f.check()
}

// agentLeft reports whether s noticed the agent of an answer it logs
// gone.
func agentLeft(s *Server) bool {
	s.answers.Mu.Lock()
	defer s.answers.Mu.Unlock()
	for _, l := range s.answers.M {
		l.Mu.Lock()
		left := l.Left
		l.Mu.Unlock()
		if left {
			return true
		}
	}
	return false
}

// TestSharedAnswerHandedOverAtShutdown: replica 0 stops (as in a rolling
// upgrade) while it reads a call's answer for an agent that left, from a
// server that gives its events ids. The answer is handed over, not ended:
// the agent's GET on replica 1 follows the shared log until replica 0's
// lease runs out, then replica 1 takes the answer over and asks the server
// for the rest with its last event id, and the agent gets the result,
// numbered after its last event. The call ran once.
func TestSharedAnswerHandedOverAtShutdown(t *testing.T) {
	t.Parallel()
	var st resumeStub
	release := make(chan struct{})
	result := strings.Replace(resumeResult, "data: ", "id: e2\ndata: ", 1) + "\n\n"
	up := st.start(t, func(w http.ResponseWriter, _ *http.ResponseController) {
		streamEvents(w, "id: e1\n"+`data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"started"}}`+"\n\n")
		<-release
		streamEvents(w, result)
	}, func(w http.ResponseWriter, lastID string) {
		if lastID != "e1" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		<-release
		streamEvents(w, result)
	})
	f, _ := sharedFleet(t, up)
	sid := peers.RawInitialize(t, f.replica(0))
	resp, err := peers.RawClient.Do(peers.PostRequest(t, f.replica(0), sid, resumeCall))
	if err != nil {
		t.Fatal(err)
	}
	id := readFirstEvent(t, bufio.NewReader(resp.Body))
	_ = resp.Body.Close()
	peers.Wait(t, "replica 0 to notice the agent gone and write the answer to the shared store", func() bool {
		return agentLeft(f.procs[0].s) && f.procs[0].s.count.SharedAnswers[obs.SharedWritten].Load() == 1
	})
	f.procs[0].kill()
	close(release)
	// The take-over waits out replica 0's lease (5 s): longer than the
	// raw client's timeout.
	req, _ := http.NewRequest(http.MethodGet, f.replica(1), nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Last-Event-ID", id)
	got, err := (&http.Client{Timeout: peers.Timeout + 10*time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(got.Body)
	got.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSuffix(id, "-1") + "-2"
	if got.StatusCode != http.StatusOK || !strings.Contains(string(body), "id: "+want+"\n") || !strings.Contains(string(body), `"text":"done"`) {
		t.Fatalf("resume on replica 1 after replica 0 stopped: %d %q; want the result as event %s", got.StatusCode, body, want)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
	if ids := st.ids(); len(ids) == 0 || ids[len(ids)-1] != "e1" {
		t.Errorf("the upstream's GETs had Last-Event-ID %q, want the last e1", ids)
	}
	if n := f.procs[1].s.count.SharedAnswers[obs.SharedTaken].Load(); n != 1 {
		t.Errorf("replica 1 took %d answers over, want 1", n)
	}
}
