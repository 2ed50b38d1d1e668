// Package redistest runs a real redis-server (Debian's package) on a free
// loopback port for tests, and stops it when the test ends. Tests can stop,
// freeze and restart it to play a store that is down, slow or emptied.
//
// Without redis-server on PATH the test is skipped, except under CI (the
// CI environment variable set), where .ci/run installs it and its absence
// fails the test.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	Addr string

	t    testing.TB
	bin  string
	port int
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// Start starts an empty, non-persistent redis-server on 127.0.0.1, with
// extra command-line arguments (e.g. "--requirepass", "pw").
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (CI installs Debian's redis-server): %v", err)
		}
		t.Skip("redis-server not installed (apt-get install redis-server); CI runs this test")
	}
	s := &Server{t: t, bin: bin, port: freePort(t), args: args}
	s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	args := append([]string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", s.t.TempDir()}, s.args...)
	cmd := exec.Command(s.bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		s.t.Fatal("redis-server did not start in 10 s")
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
}

// Stop kills the server (SIGKILL: no goodbye to its clients) and waits.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a frozen server dies too
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart stops the server and starts an empty one on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Freeze stops the server process (SIGSTOP): connections stay open and no
// answer comes, as from an overloaded store. Thaw resumes it.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
