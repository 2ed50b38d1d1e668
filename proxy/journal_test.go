package proxy

// A session's journal (its log level and subscribed URIs, replayed on every
// new upstream session) is state an agent makes mcpheal hold for the
// session's life. Unbounded, one agent subscribing to enough long URIs took
// the process to a gigabyte while the memory budget still admitted new
// sessions. These tests pin the bounds: a cap per session (max_journal,
// -32019, not sent upstream) and the memory budget (the journal counted,
// -32017 for a request, -32015 for a new session), and that what is kept
// is still replayed after a heal.

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// journalURI returns a distinct resource URI of exactly n bytes.
func journalURI(i, n int) string {
	p := "file:///journal/" + strconv.Itoa(i) + "/"
	return p + strings.Repeat("u", n-len(p))
}

func subscribeBody(id int, method, uri string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":{"uri":%q}}`, id, method, uri)
}

// TestJournalCappedPerSession: subscriptions of 16 KiB URIs fill the
// session's journal up to max_journal (64 KiB); the one past it is answered
// -32019 and never reaches the upstream, and so is a logging/setLevel,
// whose params count too. Each kept byte is counted in the memory budget;
// an unsubscribe makes room again; after a heal the journal is replayed on
// the new upstream session; a DELETE gives every byte back.
func TestJournalCappedPerSession(t *testing.T) {
	t.Parallel()
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) { c.Keepalive = -1 })
	before := memSettled(t, s)
	sid := peers.RawInitialize(t, url)
	base := memSettled(t, s)
	const size = 16 << 10
	uris := make([]string, 6)
	for i := range uris {
		uris[i] = journalURI(i, size)
	}
	id := 10
	call := func(method, uri string) (int, string) {
		t.Helper()
		id++
		status, ans := agentRPC(t, url, sid, subscribeBody(id, method, uri))
		if ans.Get("result").Exists() {
			return status, "result"
		}
		return status, ans.Get("error.code").Raw
	}
	grown := func(want int64, after string) {
		t.Helper()
		if got := memSettled(t, s) - base; got != want {
			t.Fatalf("after %s the memory budget counts %d bytes more than the bare session, want %d", after, got, want)
		}
	}

	for i := range 4 { // 4 × 16 KiB = max_journal exactly
		if status, got := call("resources/subscribe", uris[i]); status != http.StatusOK || got != "result" {
			t.Fatalf("subscribe %d (%d journal bytes before): %d %s, want the upstream's result", i, i*size, status, got)
		}
	}
	grown(4*size, "4 subscriptions of 16 KiB")
	if status, got := call("resources/subscribe", uris[4]); status != http.StatusOK || got != "-32019" {
		t.Fatalf("subscribe past max_journal: %d %s, want 200 with -32019", status, got)
	}
	if got := up.URIs("resources/subscribe", ""); !slices.Equal(got, uris[:4]) {
		t.Fatalf("the upstream received %d subscribes, want the 4 within the cap and not the one past it", len(got))
	}
	level := `{"level":"debug"}`
	if status, ans := agentRPC(t, url, sid, `{"jsonrpc":"2.0","id":90,"method":"logging/setLevel","params":`+level+`}`); status != http.StatusOK || ans.Get("error.code").Int() != -32019 {
		t.Fatalf("logging/setLevel on a full journal: %d %s, want 200 with -32019", status, ans.Raw)
	}
	if n := len(up.Got("logging/setLevel")); n != 0 {
		t.Fatalf("the upstream received %d logging/setLevel past max_journal, want 0", n)
	}
	grown(4*size, "two refused requests")

	if status, got := call("resources/unsubscribe", uris[0]); status != http.StatusOK || got != "result" {
		t.Fatalf("unsubscribe: %d %s", status, got)
	}
	grown(3*size, "an unsubscribe")
	if status, got := call("resources/subscribe", uris[4]); status != http.StatusOK || got != "result" {
		t.Fatalf("subscribe after an unsubscribe made room: %d %s, want the upstream's result", status, got)
	}
	grown(4*size, "the subscribe that took the room back")
	if status, got := call("resources/unsubscribe", uris[1]); status != http.StatusOK || got != "result" {
		t.Fatalf("unsubscribe: %d %s", status, got)
	}
	if status, ans := agentRPC(t, url, sid, `{"jsonrpc":"2.0","id":91,"method":"logging/setLevel","params":`+level+`}`); status != http.StatusOK || !ans.Get("result").Exists() {
		t.Fatalf("logging/setLevel with room left: %d %s", status, ans.Raw)
	}
	grown(int64(3*size+len(level)), "a logging/setLevel")
	// 3 URIs and the level: one more 16 KiB URI passes the cap by the
	// level's size.
	if status, got := call("resources/subscribe", uris[5]); status != http.StatusOK || got != "-32019" {
		t.Fatalf("subscribe that the level's bytes put past max_journal: %d %s, want 200 with -32019", status, got)
	}

	// The upstream forgets the session: the heal replays what is kept.
	up.Expire()
	if status, ans := agentRPC(t, url, sid, `{"jsonrpc":"2.0","id":92,"method":"ping"}`); status != http.StatusOK || !ans.Get("result").Exists() {
		t.Fatalf("ping after the upstream forgot the session: %d %s", status, ans.Raw)
	}
	if n := up.inits.Load(); n != 2 {
		t.Fatalf("%d upstream initializes, want 2 (the agent's and one heal)", n)
	}
	healed := up.Sessions()[1]
	want := slices.Sorted(slices.Values(uris[2:5]))
	if got := up.URIs("resources/subscribe", healed); !slices.Equal(got, want) {
		t.Fatalf("the healed upstream session got %d subscribes, want the journal's %d", len(got), len(want))
	}
	var levels []string
	for _, e := range up.Got("logging/setLevel") {
		if e.Session == healed {
			levels = append(levels, e.Params)
		}
	}
	if !slices.Equal(levels, []string{level}) {
		t.Fatalf("the healed upstream session got logging/setLevel %q, want [%s]", levels, level)
	}
	grown(int64(3*size+len(level)), "the heal")

	if status := agentDelete(t, url, sid); status != http.StatusOK {
		t.Fatalf("DELETE: %d", status)
	}
	if got := memSettled(t, s); got != before {
		t.Fatalf("after DELETE the memory budget counts %d bytes, want %d as before the session", got, before)
	}
	noPanics(t, s)
}

// TestJournalInMemoryBudget: journals are counted in memory_budget. With a
// budget that one session's subscriptions fill, a subscription past it gets
// 503 -32017 and is not sent, a new session gets 503 -32015 — whatever the
// agents hold, new sessions are not admitted beyond the budget — and once
// the session is DELETEd its memory is free for a new one.
func TestJournalInMemoryBudget(t *testing.T) {
	t.Parallel()
	const budget = 48 << 10 // under max_journal: the budget is what refuses
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) {
		c.Keepalive = -1
		c.MemoryBudget = budget
	})
	sid := peers.RawInitialize(t, url)
	id := 10
	subscribe := func(uri string) (int, int64) {
		t.Helper()
		id++
		status, ans := agentRPC(t, url, sid, subscribeBody(id, "resources/subscribe", uri))
		if ans.Get("result").Exists() {
			return status, 0
		}
		return status, ans.Get("error.code").Int()
	}
	var sent []string
	for i := range 2 {
		uri := journalURI(i, 16<<10)
		if status, code := subscribe(uri); status != http.StatusOK || code != 0 {
			t.Fatalf("subscribe %d within the budget: %d %d", i, status, code)
		}
		sent = append(sent, uri)
	}
	// Leave less room than a session costs (2 KiB and its initialize),
	// more than an answer to buffer.
	left := budget - memSettled(t, s)
	if left <= 1200 {
		t.Fatalf("only %d bytes of the budget left after 32 KiB of journal; the test's sizes need adjusting", left)
	}
	uri := journalURI(2, int(left)-1000)
	if status, code := subscribe(uri); status != http.StatusOK || code != 0 {
		t.Fatalf("subscribe of %d bytes with %d left: %d %d", len(uri), left, status, code)
	}
	sent = append(sent, uri)
	if left := budget - memSettled(t, s); left > 1100 {
		t.Fatalf("%d bytes of the budget left after the journal took it, want about 1000: the journal is not counted", left)
	}

	if status, code := subscribe(journalURI(3, 2<<10)); status != http.StatusOK || code != -32017 {
		t.Fatalf("subscribe past memory_budget: %d %d, want 200 -32017", status, code)
	}
	if got := up.URIs("resources/subscribe", ""); !slices.Equal(got, sent) {
		t.Fatalf("the upstream received %d subscribes, want the %d within the budget", len(got), len(sent))
	}
	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"late","version":"1"}}}`
	resp, raw := peers.RawPost(t, url, "", initBody)
	if code := rpcAnswer(raw).Get("error.code").Int(); resp.StatusCode != http.StatusOK || code != -32015 {
		t.Fatalf("initialize with the budget held by a journal: %d %s, want 200 -32015", resp.StatusCode, raw)
	}
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		t.Fatalf("a refused initialize got a session id %q", sid)
	}

	if status := agentDelete(t, url, sid); status != http.StatusOK {
		t.Fatalf("DELETE: %d", status)
	}
	memSettled(t, s)
	if late := peers.RawInitialize(t, url); late == "" {
		t.Fatal("no session after the journal's memory was given back")
	}
	noPanics(t, s)
}

// TestJournalCapHoldsUnderConcurrency: max_journal holds for requests in
// flight together. Eight subscribes of distinct 16 KiB URIs sent at once on
// an empty journal: only what fits (4 × 16 KiB) may reach the upstream, the
// others are answered -32019 unsent. The upstream holds its answers until
// every request that will come has come, so that all eight are in flight
// together. Were the cap checked against the recorded journal alone, every
// one would pass it, and N concurrent requests would make a journal of N
// URIs — the unbounded journal again, bounded only by the budget.
func TestJournalCapHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const n, size = 8, 16 << 10
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) { c.Keepalive = -1 })
	sid := peers.RawInitialize(t, url)
	base := memSettled(t, s)
	release := up.Hold()
	codes := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		req := peers.PostRequest(t, url, sid, subscribeBody(100+i, "resources/subscribe", journalURI(i, size)))
		go func() { // no t.Fatal off the test's goroutine: errors are answers here
			defer wg.Done()
			resp, err := peers.RawClient.Do(req)
			if err != nil {
				codes <- err.Error()
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if ans := rpcAnswer(raw); resp.StatusCode == http.StatusOK && ans.Get("result").Exists() {
				codes <- "result"
			} else {
				codes <- strconv.Itoa(resp.StatusCode) + " " + ans.Get("error.code").Raw
			}
		}()
	}
	// Wait for the subscribes to stop arriving: all eight, or those the
	// proxy let through.
	last, since := -1, time.Now()
	for len(up.Got("resources/subscribe")) < n && time.Since(since) < 500*time.Millisecond {
		if k := len(up.Got("resources/subscribe")); k != last {
			last, since = k, time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(codes)
	got := map[string]int{}
	for c := range codes {
		got[c]++
	}
	sent := len(up.Got("resources/subscribe"))
	grew := memSettled(t, s) - base
	if sent > 4 || got["result"] > 4 || grew > 4*size {
		t.Fatalf("%d concurrent subscribes of 16 KiB: %d reached the upstream, answers %v, the journal grew by %d bytes; "+
			"want at most 4 (64 KiB, max_journal), the others -32019 unsent", n, sent, got, grew)
	}
	if got["result"] != 4 || got["200 -32019"] != 4 {
		t.Fatalf("answers %v, want 4 results and 4 × 200 -32019", got)
	}
	noPanics(t, s)
}

// TestJournalLevelReplacedAtCap: a logging/setLevel replaces the level the
// journal holds, so on a journal at max_journal one no longer than the
// level it replaces does not pass the cap: it must go through. (The agent
// that wants less logging must not have to drop a subscription first.)
func TestJournalLevelReplacedAtCap(t *testing.T) {
	t.Parallel()
	const size = 16 << 10
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) { c.Keepalive = -1 })
	sid := peers.RawInitialize(t, url)
	setLevel := func(level string) (int, gjson.Result) {
		t.Helper()
		return agentRPC(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"`+level+`"}}`)
	}
	debug := `{"level":"debug"}`
	if status, ans := setLevel("debug"); status != http.StatusOK || !ans.Get("result").Exists() {
		t.Fatalf("logging/setLevel on an empty journal: %d %s", status, ans.Raw)
	}
	// The level and four URIs make exactly max_journal.
	for i := range 4 {
		n := size
		if i == 3 {
			n -= len(debug)
		}
		if status, ans := agentRPC(t, url, sid, subscribeBody(10+i, "resources/subscribe", journalURI(i, n))); status != http.StatusOK || !ans.Get("result").Exists() {
			t.Fatalf("subscribe %d: %d %s", i, status, ans.Raw)
		}
	}
	if status, ans := agentRPC(t, url, sid, subscribeBody(20, "resources/subscribe", "file:///x")); status != http.StatusOK || ans.Get("error.code").Int() != -32019 {
		t.Fatalf("subscribe on a journal at max_journal: %d %s, want -32019: the journal is not full, the test's sizes are off", status, ans.Raw)
	}
	for _, level := range []string{"debug", "info"} { // the same size, then 1 byte less
		if status, ans := setLevel(level); status != http.StatusOK || !ans.Get("result").Exists() {
			t.Errorf("logging/setLevel %q replacing %s on a journal at max_journal: %d %s, want the upstream's result",
				level, debug, status, ans.Raw)
		}
	}
	if got := len(up.Got("logging/setLevel")); got != 3 {
		t.Errorf("the upstream received %d logging/setLevel, want 3", got)
	}
	noPanics(t, s)
}
