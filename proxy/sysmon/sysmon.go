package sysmon

import (
	"os"
	"strconv"
	"strings"
)

// Setting is the GODEBUG entry that keeps sysmon awake: schedtrace's
// longest period, in milliseconds (an int32).
const Setting = "schedtrace=2147483647"

// Env returns env with [Setting] added to GODEBUG, and whether it added it.
// It adds nothing when GODEBUG already names schedtrace, whatever its value:
// that is the operator's choice. Like the runtime, it reads the first
// GODEBUG entry of env.
func Env(env []string) ([]string, bool) {
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		if _, set := lookup(v, "schedtrace"); set {
			return env, false
		}
		out := append([]string(nil), env...)
		if v == "" {
			out[i] = "GODEBUG=" + Setting
		} else {
			out[i] = kv + "," + Setting
		}
		return out, true
	}
	return append(append([]string(nil), env...), "GODEBUG="+Setting), true
}

// Awake reports whether the runtime keeps this process's sysmon awake:
// GODEBUG's schedtrace (the last one, as the runtime reads it) is above 0,
// as [Reexec] leaves it.
func Awake() bool {
	v, _ := lookup(os.Getenv("GODEBUG"), "schedtrace")
	n, err := strconv.ParseInt(v, 10, 32)
	return err == nil && n > 0
}

// lookup returns the value of key's last entry in the GODEBUG value v.
func lookup(v, key string) (val string, set bool) {
	for f := range strings.SplitSeq(v, ",") {
		if k, x, ok := strings.Cut(f, "="); ok && k == key {
			val, set = x, true
		}
	}
	return val, set
}
