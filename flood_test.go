package main

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestConnectionFloodDoesNotEndTheProcess (docs/security.md "Under attack"): the real
// binary, with 64 file descriptors, is sent 100 idle TCP connections, and
// a well-behaved agent comes while they stay open. mcpheal holds agents'
// connections below three quarters of its descriptors: at the cap a new
// connection takes the place of the one idle longest, so the agent's
// session and call are served throughout, the sheds are counted in the
// log, and the process lives. It used to exit at "too many open files";
// then to stop answering until the flood left.
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
	// The flood's connections stay open; a well-behaved agent is served.
	url := "http://" + addr + "/mcp"
	sid := initSession(t, url)
	for i := range 5 {
		if st, _, body := postRPC(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"during"}}}`); st != http.StatusOK || !strings.Contains(body, "during") {
			t.Fatalf("echo %d during the flood: %d %s\n%s", i, st, body, c.stderr)
		}
	}
	select {
	case <-c.exited:
		t.Fatalf("mcpheal exited under the flood (%v):\n%s", c.cmd.ProcessState, c.stderr)
	default:
	}
	if n := up.calls.Load(); n != 5 {
		t.Errorf("echo ran %d times for 5 calls", n)
	}
	// Shedding idle connections is what made room: the flood's own were
	// closed by mcpheal.
	closed := 0
	for _, f := range flood {
		_ = f.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := f.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	if closed == 0 {
		t.Errorf("no flood connection was closed by mcpheal: nothing shed\n%s", c.stderr)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
