package main

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestConnectionFloodDoesNotEndTheProcess (README "Under attack"): the real
// binary, with 64 file descriptors, is sent 100 idle TCP connections. At the
// limit its listener fails with "too many open files"; mcpheal logs it and
// goes on (it used to exit), and once the flood's connections close it
// answers again.
func TestConnectionFloodDoesNotEndTheProcess(t *testing.T) {
	t.Parallel()
	up := startCountingServer(t)
	bin := buildBinary(t)
	addr := fixedAddr(t)
	c := startChild(t, "/bin/sh", addr, nil, "-c",
		"ulimit -n 64 && exec "+bin+" --upstream "+up.URL+" --listen "+addr+" --admin-listen off --log-format json")
	var flood []net.Conn
	defer func() {
		for _, f := range flood {
			_ = f.Close()
		}
	}()
	for range 100 {
		f, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		flood = append(flood, f)
	}
	deadline := time.Now().Add(10 * time.Second)
	for out := ""; !strings.Contains(out, "cannot accept connections"); out = c.stderr.String() {
		select {
		case <-c.exited:
			t.Fatalf("mcpheal exited under the flood (%v):\n%s", c.cmd.ProcessState, out)
		default:
		}
		if strings.Contains(out, "accept") && strings.Contains(out, "too many open files") {
			t.Fatalf("mcpheal stopped accepting under the flood:\n%s", out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %d connections open mcpheal did not say it waits out accept errors (does it still accept?):\n%s", len(flood), out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, f := range flood {
		_ = f.Close()
	}
	flood = nil
	deadline = time.Now().Add(10 * time.Second)
	for {
		select {
		case <-c.exited:
			t.Fatalf("mcpheal exited (%v):\n%s", c.cmd.ProcessState, c.stderr)
		default:
		}
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("mcpheal did not answer again within 10 s after the flood ended:\n%s", c.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A well-behaved agent's session works.
	sid := initSession(t, "http://"+addr+"/mcp")
	if st, _, body := postRPC(t, "http://"+addr+"/mcp", sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`); st != http.StatusOK || !strings.Contains(body, "after") {
		t.Fatalf("echo after the flood: %d %s", st, body)
	}
}
