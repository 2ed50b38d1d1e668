package peers

import (
	"net/http"
	"strings"
	"testing"
)

// recTB is a testing.TB whose failures and cleanups a test reads.
type recTB struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recTB) Helper()                           {}
func (r *recTB) Errorf(format string, args ...any) { r.errs = append(r.errs, format) }
func (r *recTB) Failed() bool                      { return len(r.errs) > 0 }
func (r *recTB) Cleanup(f func())                  { r.cleanups = append(r.cleanups, f) }
func (r *recTB) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestScriptKeys: a Script answers by the exact key first, then by Any; a
// request no key matches fails the test with a 500; a Reply not Optional
// that never came fails it at the end.
func TestScriptKeys(t *testing.T) {
	rec := &recTB{TB: t}
	replies := Session("S1", "{}")
	replies[Key{http.MethodPost, "S1", "tools/call"}] = &Reply{Body: "exact"}
	replies[Key{http.MethodPost, "S1", Any}] = &Reply{Body: "any method"}
	replies[Key{http.MethodGet, Any, Any}] = &Reply{Status: http.StatusMethodNotAllowed}
	replies[Key{http.MethodDelete, "S1", ""}] = &Reply{} // never sent
	s := StartScript(rec, replies)
	post := func(sid, body string) (int, string) {
		req := PostRequest(t, s.URL(), sid, body)
		resp, raw := RawDo(t, req)
		return resp.StatusCode, string(raw)
	}
	if st, b := post("S1", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`); st != 200 || b != "exact" {
		t.Errorf("tools/call: %d %q, want the exact key's reply", st, b)
	}
	if st, b := post("S1", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); st != 200 || b != "any method" {
		t.Errorf("tools/list: %d %q, want the Any key's reply", st, b)
	}
	if st, _ := post("S2", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); st != http.StatusInternalServerError || len(rec.errs) != 1 {
		t.Errorf("an unscripted request: %d, %d failures; want 500 and one", st, len(rec.errs))
	}
	if n := s.Calls(Key{http.MethodPost, "S1", Any}); n != 1 {
		t.Errorf("Calls(any method) = %d, want 1", n)
	}
	rec.errs = nil
	rec.end()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "never got") || len(s.Missing()) != 2 {
		t.Errorf("at the end: %q, missing %v; want the DELETE and GET keys reported", rec.errs, s.Missing())
	}
}
