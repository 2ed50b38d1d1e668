package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is a process the harness started; it dies with the harness
// (Pdeathsig) and is always stopped by the harness.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit status; written once before done is closed
}

// niceLevel is the scheduling priority of every process the harness starts
// (set once from -nice before any is started). On a shared machine a
// negative value keeps other people's builds from queueing in front of the
// measured processes; all targets get the same.
var niceLevel int

// startChild runs argv with stderr appended to logPath and env added to the
// harness's environment. With waitReady set it waits until the child prints
// readyLine on stdout (or exits, or ctx ends).
func startChild(ctx context.Context, name, logPath string, waitReady bool, env []string, argv ...string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	if niceLevel != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(niceLevel)}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = logf
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == readyLine {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.done)
	}()
	if !waitReady {
		return c, nil
	}
	select {
	case <-ready:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("%s exited before it was ready: %v (log %s)", name, c.err, logPath)
	case <-ctx.Done():
		c.kill()
		return nil, fmt.Errorf("%s: %w", name, ctx.Err())
	}
}

// pid returns the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// stop asks the child to end (SIGTERM) and kills it after grace.
func (c *child) stop(grace time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.kill()
	}
}

// kill ends the child at once and waits for it.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// procSample is what /proc says about a group of processes at one instant.
type procSample struct {
	cpuTicks uint64 // utime+stime, in USER_HZ ticks
	hwmKB    uint64 // sum of VmHWM (peak resident set)
	rssKB    uint64 // sum of VmRSS
	syscalls uint64 // read- and write-class system calls (syscr+syscw)
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTick = 100

// sampleProcs reads CPU time and memory of pids.
func sampleProcs(pids []int) (procSample, error) {
	var s procSample
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return s, err
		}
		// Fields after the parenthesised command name; utime and stime are
		// the 14th and 15th fields of the whole line (proc(5)).
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) < 13 {
			return s, fmt.Errorf("/proc/%d/stat: short line", pid)
		}
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		s.cpuTicks += ut + st
		hwm, rss, err := memKB(pid)
		if err != nil {
			return s, err
		}
		s.hwmKB += hwm
		s.rssKB += rss
		s.syscalls += ioSyscalls(pid)
	}
	return s, nil
}

// ioSyscalls returns syscr+syscw of /proc/<pid>/io (0 if unreadable).
func ioSyscalls(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	var n uint64
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (k == "syscr" || k == "syscw") {
			x, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			n += x
		}
	}
	return n
}

// memKB returns VmHWM and VmRSS of pid in KiB.
func memKB(pid int) (hwm, rss uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss, sc.Err()
}

// godebugOf returns GODEBUG as process pid was started with it (Linux:
// /proc/<pid>/environ), "(none)" without one, or "?" if it is unreadable.
func godebugOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "?"
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			return v
		}
	}
	return "(none)"
}

// childPids returns the pids whose parent is ppid (nginx's workers).
func childPids(ppid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

// cpuStat is the machine-wide line "cpu" of /proc/stat, in ticks.
type cpuStat struct{ total, idle, steal uint64 }

func readCPUStat() (cpuStat, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuStat{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuStat{}, errors.New("/proc/stat: empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuStat{}, errors.New("/proc/stat: no cpu line")
	}
	var s cpuStat
	for i, v := range fields[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal (guest is inside user)
			s.total += n
		}
		switch i {
		case 3, 4: // idle, iowait
			s.idle += n
		case 7:
			s.steal = n
		}
	}
	return s, nil
}

// busyPct returns how busy all CPUs were between two samples, in percent.
func busyPct(a, b cpuStat) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 - 100*float64(b.idle-a.idle)/float64(b.total-a.total)
}

// stealPct returns the share of CPU time stolen by the hypervisor between
// two samples, in percent.
func stealPct(a, b cpuStat) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}
