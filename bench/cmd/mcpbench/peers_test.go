package main

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

func TestPeerRunLength(t *testing.T) {
	p := peersConfig{duration: 10 * time.Second, minRequests: 300}
	for rate, want := range map[int]time.Duration{10: 30 * time.Second, 100: 10 * time.Second, 2000: 10 * time.Second} {
		if got := p.runLength(rate); got != want {
			t.Errorf("runLength(%d) = %s, want %s", rate, got, want)
		}
	}
	if err := p.parseRates("10, 200,"); err != nil || !slices.Equal(p.rates, []int{10, 200}) {
		t.Errorf("parseRates = %v, %v", p.rates, err)
	}
	if err := p.parseRates("10,x"); err == nil {
		t.Error("parseRates accepted x")
	}
}

// TestTreeHoldsForkedChildren: a process's tree holds what it forked, and
// the tree's CPU counts a child that exited and was reaped.
func TestTreeHoldsForkedChildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", `sleep 5 & i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done & wait $!; wait`)
	if err := cmd.Start(); err != nil {
		t.Skip("no sh:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(200 * time.Millisecond)
	pids := treePids(cmd.Process.Pid)
	if len(pids) < 2 || pids[0] != cmd.Process.Pid {
		t.Fatalf("treePids = %v, want the shell and its children", pids)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := sampleTree(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		// The busy loop ran in a subshell that the shell reaps: its
		// ticks move to the shell's cutime and stay in the tree's figure.
		if st, _ := readProcStat(cmd.Process.Pid); st.childrenTicks > 0 {
			if s.cpuTicks < st.childrenTicks {
				t.Fatalf("tree CPU %d ticks < reaped children's %d", s.cpuTicks, st.childrenTicks)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Skip("the busy subshell used under a tick")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestObserveServer: the observe upstream logs each initialize and each
// tool execution, and the agent's call says what came back.
func TestObserveServer(t *testing.T) {
	events := filepath.Join(t.TempDir(), "events")
	h, err := observeServer(events)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx := context.Background()
	a := &obsAgent{hc: srv.Client(), echo: "echo", write: "write"}
	if a.sess, err = bench.InitializeAs(ctx, a.hc, bench.Session{URL: srv.URL, Tool: "echo"}, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.call(ctx, 1, "echo", map[string]any{"text": "hi"}); got != "ok: hi" {
		t.Errorf("echo: got %q", got)
	}
	for i := range 2 {
		if got, _ := a.call(ctx, 2+i, "write", map[string]any{"key": "k"}); got != "ok: wrote k" {
			t.Errorf("write: got %q", got)
		}
	}
	if got, _ := a.call(ctx, 9, "nope", nil); !strings.Contains(got, "error") {
		t.Errorf("unknown tool: got %q, want an error", got)
	}
	u := &obsUpstream{events: events}
	if n := u.count("init", ""); n != 1 {
		t.Errorf("initializes logged: %d, want 1", n)
	}
	if n := u.count("write", "k"); n != 2 {
		t.Errorf("writes of k logged: %d, want 2", n)
	}
	if n := u.count("echo", "hi"); n != 1 {
		t.Errorf("echoes of hi logged: %d, want 1", n)
	}
}
