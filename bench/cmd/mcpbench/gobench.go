package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// benchLine is one result line of go test -bench.
type benchLine struct {
	Pkg, Name string
	NsOp      float64
	BOp       float64
	AllocsOp  float64
	P99us     float64 // the p99-µs metric, where reported
}

// runGoBench runs the classifier and request-path micro-benchmarks.
func (h *harness) runGoBench(ctx context.Context) error {
	h.logf("go test -bench ./classify/ ./bench/")
	argv := []string{"go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-count", "1", "./classify/", "./bench/"}
	if niceLevel != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(niceLevel)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = h.root
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(h.dir, "gobench.txt"), out, 0o644)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	h.gobench = parseBench(out)
	// The session stores side by side, five times each, for medians.
	h.logf("go test -bench BenchmarkSessionStore -count 5 ./bench/")
	argv = []string{"go", "test", "-run", "^$", "-bench", "BenchmarkSessionStore", "-benchmem", "-count", "5", "./bench/"}
	if niceLevel != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(niceLevel)}, argv...)
	}
	cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = h.root
	out, err = cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(h.dir, "gobench-store.txt"), out, 0o644)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	h.storeBench = parseBench(out)
	return nil
}

// parseBench reads go test -bench output.
func parseBench(out []byte) []benchLine {
	var res []benchLine
	pkg := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "pkg:" {
			pkg = f[1]
			continue
		}
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		b := benchLine{Pkg: pkg, Name: f[0]}
		exact := false
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				b.NsOp = v
			case "B/op":
				b.BOp = v
			case "allocs/op":
				if !exact {
					b.AllocsOp = v
				}
			case "mallocs/op": // the same count with its fraction, where reported
				b.AllocsOp, exact = v, true
			case "p99-µs":
				b.P99us = v
			}
		}
		res = append(res, b)
	}
	return res
}
