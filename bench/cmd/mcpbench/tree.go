package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A peer (a gateway written in another language) may fork workers of its
// own: its CPU per request is that of its whole process tree. sampleTree
// walks the tree at every sample, so that a worker forked during a run
// counts; the CPU of a worker that exited and was reaped inside the tree is
// in its parent's cutime+cstime, which sampleTree adds, so that it is not
// lost either.

// procStat is what /proc/<pid>/stat says of one process.
type procStat struct {
	ppid          int
	start         uint64 // starttime, in ticks since boot: with the pid, names the process
	ticks         uint64 // utime+stime
	childrenTicks uint64 // cutime+cstime: reaped children, all their lives
}

// readProcStat reads /proc/<pid>/stat.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// Fields after the parenthesised command name: state is f[0], ppid
	// f[1]; utime, stime, cutime and cstime are the 14th to 17th fields of
	// the whole line (proc(5)).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: short line", pid)
	}
	var s procStat
	s.ppid, _ = strconv.Atoi(f[1])
	var v [4]uint64
	for i := range v {
		v[i], _ = strconv.ParseUint(f[11+i], 10, 64)
	}
	s.ticks, s.childrenTicks = v[0]+v[1], v[2]+v[3]
	s.start, _ = strconv.ParseUint(f[19], 10, 64)
	return s, nil
}

// treePids returns root and every live process descending from it.
func treePids(root int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root}
	}
	kids := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readProcStat(pid); err == nil {
			kids[st.ppid] = append(kids[st.ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, kids[out[i]]...)
	}
	return out
}

// sampleTree is sampleProcs over root's process tree: CPU (utime+stime of
// every live process, plus the cutime+cstime of each, its reaped
// children's), memory and system calls. A process that exits between the
// walk and its read is left out of this sample.
func sampleTree(root int) (procSample, error) {
	var s procSample
	for i, pid := range treePids(root) {
		st, err := readProcStat(pid)
		if err != nil {
			if i == 0 {
				return s, err
			}
			continue
		}
		s.cpuTicks += st.ticks + st.childrenTicks
		hwm, rss, err := memKB(pid)
		if err != nil && i == 0 {
			return s, err
		}
		s.hwmKB += hwm
		s.rssKB += rss
		s.syscalls += ioSyscalls(pid)
	}
	return s, nil
}

// cpuGroup is a cgroup (v1 cpuacct) holding one measured process tree:
// cpuacct.usage counts its CPU in nanoseconds, exited processes and
// threads included, where /proc/<pid>/stat counts 10 ms ticks. At the
// low rates of the peers leg (10 req/s, a fraction of a millisecond of
// CPU per request for nginx and mcpheal) the ticks alone would leave a
// third of a run's figure to rounding. Nil where no cpuacct hierarchy
// is writable; the figures then come from sampleTree.
type cpuGroup struct{ dir string }

// cpuacctRoot is where a cgroup v1 cpuacct hierarchy is mounted.
const cpuacctRoot = "/sys/fs/cgroup/cpuacct"

// newCPUGroup makes a cpuacct group named name and moves root's process
// tree into it; the processes the tree forks later are born in it. It
// returns nil when that is not possible here.
func newCPUGroup(name string, root int) *cpuGroup {
	dir := filepath.Join(cpuacctRoot, fmt.Sprintf("mcpbench-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil
	}
	g := &cpuGroup{dir: dir}
	for _, pid := range treePids(root) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			g.remove()
			return nil
		}
	}
	return g
}

// usageNs returns the group's CPU time so far, in nanoseconds.
func (g *cpuGroup) usageNs() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// remove deletes the group once its processes have exited (the kernel
// refuses while a process is still in it, and the group then stays).
func (g *cpuGroup) remove() {
	if g != nil {
		_ = os.Remove(g.dir)
	}
}
