package peers

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// A Script is the one keyed scripted fake: an upstream for the faults no
// real peer makes (an odd status, a stream cut at a chosen byte, a stall),
// answering each request by its Key from the Replies it was given. A request
// no Key matches fails the test and is answered 500; a Reply that is not
// Optional and never asked for fails it at the end (Missing). A real peer
// (StartGoSDK, StartMCPGo) serves wherever one can make the fault.
type Script struct {
	t       testing.TB
	url     string
	replies map[Key]*Reply

	mu     sync.Mutex
	called map[Key]int
}

// Key names the requests one Reply answers. Any in a field matches every
// value of it; a lookup tries the exact key first, then with Any for the
// JSON-RPC method, then for the session, then for both.
type Key struct {
	HTTP    string // the HTTP method: POST, GET, DELETE
	Session string // the Mcp-Session-Id header, "" for none
	RPC     string // the JSON-RPC method of a POST ("" for a response, GET, DELETE; Batch for a batch)
}

const (
	// Any matches every value of a Key's field.
	Any = "*"
	// Batch is the RPC of a POST whose body is a JSON-RPC batch.
	Batch = "[batch]"
)

// A Reply is a Script's answer to the requests of one Key.
type Reply struct {
	Status int               // 0: 200
	Header map[string]string // set before the status
	Body   string
	// Serve answers instead of Status, Header and Body (a stream, a stall,
	// a cut). The request's body can be read again.
	Serve func(w http.ResponseWriter, r *http.Request, rpc string)
	// Optional: the request need not come.
	Optional bool
}

// StartScript serves replies on 127.0.0.1 until the test ends, then
// checks that every Reply not Optional was asked for.
func StartScript(t testing.TB, replies map[Key]*Reply) *Script {
	t.Helper()
	s := &Script{t: t, replies: replies, called: map[Key]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: Timeout, Handler: s}
	go func() { _ = srv.Serve(ln) }()
	s.url = "http://" + ln.Addr().String() + "/mcp"
	t.Cleanup(func() {
		_ = srv.Close()
		if missing := s.Missing(); len(missing) > 0 && !t.Failed() {
			t.Errorf("the scripted upstream never got %v", missing)
		}
	})
	return s
}

// URL is the Script's MCP endpoint.
func (s *Script) URL() string { return s.url }

// Calls counts the requests the Reply of k answered.
func (s *Script) Calls(k Key) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.called[k]
}

// Missing lists the keys of the Replies not Optional that no request
// matched.
func (s *Script) Missing() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Key
	for k, r := range s.replies {
		if !r.Optional && s.called[k] == 0 {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b Key) int {
		return cmp.Or(strings.Compare(a.HTTP, b.HTTP), strings.Compare(a.Session, b.Session), strings.Compare(a.RPC, b.RPC))
	})
	return out
}

// ServeHTTP answers r by its key.
func (s *Script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k := Key{HTTP: r.Method, Session: r.Header.Get("Mcp-Session-Id")}
	if r.Method == http.MethodPost {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		k.RPC = rpcOf(body)
	}
	key, reply := s.lookup(k)
	if reply == nil {
		s.t.Errorf("the scripted upstream has no reply for %+v", k)
		http.Error(w, fmt.Sprintf("no reply scripted for %+v", k), http.StatusInternalServerError)
		return
	}
	s.mu.Lock()
	s.called[key]++
	s.mu.Unlock()
	if reply.Serve != nil {
		reply.Serve(w, r, k.RPC)
		return
	}
	for name, v := range reply.Header {
		w.Header().Set(name, v)
	}
	w.WriteHeader(cmp.Or(reply.Status, http.StatusOK))
	_, _ = io.WriteString(w, reply.Body)
}

// lookup finds the Reply for k, the exact key first.
func (s *Script) lookup(k Key) (Key, *Reply) {
	for _, c := range []Key{k, {k.HTTP, k.Session, Any}, {k.HTTP, Any, k.RPC}, {k.HTTP, Any, Any}} {
		if r, ok := s.replies[c]; ok {
			return c, r
		}
	}
	return k, nil
}

// rpcOf is the JSON-RPC method of a POST body: Batch for a batch, "" for
// a response or what is not JSON-RPC.
func rpcOf(body []byte) string {
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		return Batch
	}
	var m struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(body, &m)
	return m.Method
}

// Session returns the Replies of a session-era server of one session, id:
// its initialize (protocol version 2025-11-25, capabilities as raw JSON)
// and notifications/initialized, and the answer of the TS SDK v1 to a
// request before initialize for the era probe's server/discover. They are
// Optional: add to them what the test asks of the session.
func Session(id, capabilities string) map[Key]*Reply {
	return map[Key]*Reply{
		{http.MethodPost, "", "initialize"}: {Optional: true,
			Header: map[string]string{"Mcp-Session-Id": id, "Content-Type": "application/json"},
			Body:   `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":` + capabilities + `,"serverInfo":{"name":"script","version":"1"}}}`},
		{http.MethodPost, id, "notifications/initialized"}: {Optional: true, Status: http.StatusAccepted},
		{http.MethodPost, "", "server/discover"}: {Optional: true, Status: http.StatusBadRequest,
			Header: map[string]string{"Content-Type": "application/json"},
			Body:   `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}`},
	}
}
