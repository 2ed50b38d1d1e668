package sysmon

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// Setting is the GODEBUG entry that keeps sysmon awake: schedtrace's
// longest period, in milliseconds (an int32).
const Setting = "schedtrace=2147483647"

// marker is added to the environment with [Setting]: a process that has it
// was started by [Reexec] and never exec's again, whatever became of
// GODEBUG.
const marker = "MCPHEAL_SYSMON_REEXEC=1"

// Env returns env with [Setting] added to GODEBUG (and [marker] to env),
// and whether it added them. It adds nothing when GODEBUG already names
// schedtrace, whatever its value (that is the operator's choice), or when
// env has [marker]. Like the runtime, it reads the first GODEBUG entry of
// env.
func Env(env []string) ([]string, bool) {
	if slices.Contains(env, marker) {
		return env, false
	}
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		if _, set := lookup(v, "schedtrace"); set {
			return env, false
		}
		out := append(append([]string(nil), env...), marker)
		if v == "" {
			out[i] = "GODEBUG=" + Setting
		} else {
			out[i] = kv + "," + Setting
		}
		return out, true
	}
	return append(append([]string(nil), env...), "GODEBUG="+Setting, marker), true
}

// Awake reports whether the runtime keeps this process's sysmon awake:
// the schedtrace it read from GODEBUG at start is above 0, as [Reexec]
// leaves it. (The runtime reads schedtrace only at start; mcpheal never
// changes GODEBUG after.)
func Awake() bool {
	n, _ := lookup(os.Getenv("GODEBUG"), "schedtrace")
	return n > 0
}

// lookup returns key's value in the GODEBUG value v as the runtime takes
// it at start (runtime1.go, parsegodebug): the last entry whose value is an
// int32 wins, others are ignored. set reports whether any entry names key.
func lookup(v, key string) (n int64, set bool) {
	for f := range strings.SplitSeq(v, ",") {
		k, x, ok := strings.Cut(f, "=")
		if !ok || k != key {
			continue
		}
		set = true
		if m, err := strconv.ParseInt(x, 10, 32); err == nil {
			n = m
		}
	}
	return n, set
}
