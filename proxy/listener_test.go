package proxy

import (
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// flakyListener fails its first Accepts with err, then accepts from a real
// listener.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestPatientListener: accept errors a host under a connection flood gives
// (EMFILE) are waited out and counted, so that Serve never returns on them;
// a closed listener still ends Accept, also in the middle of a wait.
func TestPatientListener(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln, err: &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}}
	fl.fails.Store(4)
	var errs atomic.Uint64
	log := zerolog.Nop()
	pl := newPatientListener(fl, &log, &errs)
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			buf := make([]byte, 1)
			_, _ = c.Read(buf)
		}
	}()
	c, err := pl.Accept()
	if err != nil {
		t.Fatalf("Accept after 4 EMFILE: %v", err)
	}
	_ = c.Close()
	if n := errs.Load(); n != 4 {
		t.Errorf("counted %d accept errors, want 4", n)
	}

	fl.fails.Store(1 << 20) // out of descriptors for good: Close must end the wait
	done := make(chan error, 1)
	go func() {
		_, err := pl.Accept()
		done <- err
	}()
	for errs.Load() < 6 { // it is waiting
		runtime.Gosched()
	}
	_ = pl.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
