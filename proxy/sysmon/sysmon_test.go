package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestEnv(t *testing.T) {
	t.Parallel()
	const set, mark = "GODEBUG=" + Setting, marker
	cases := []struct {
		name string
		env  []string
		want []string
		add  bool
	}{
		{"no GODEBUG", []string{"PATH=/bin"}, []string{"PATH=/bin", set, mark}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{set, "A=1", mark}, true},
		{"other settings kept", []string{"GODEBUG=http2client=0"}, []string{"GODEBUG=http2client=0," + Setting, mark}, true},
		{"operator's schedtrace=0 wins", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"operator's own period wins", []string{"GODEBUG=x=1,schedtrace=1000"}, []string{"GODEBUG=x=1,schedtrace=1000"}, false},
		{"a setting that only ends in schedtrace", []string{"GODEBUG=noschedtrace=1"}, []string{"GODEBUG=noschedtrace=1," + Setting, mark}, true},
		{"first GODEBUG is the one read", []string{"GODEBUG=a=1", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=a=1," + Setting, "GODEBUG=schedtrace=0", mark}, true},
		// Whatever became of GODEBUG, a process Reexec started never execs again.
		{"started by Reexec", []string{"GODEBUG=", mark}, []string{"GODEBUG=", mark}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.env)
			got, add := Env(c.env)
			if !slices.Equal(got, c.want) || add != c.add {
				t.Errorf("Env(%q) = %q, %v, want %q, %v", c.env, got, add, c.want, c.add)
			}
			if !slices.Equal(c.env, in) {
				t.Errorf("Env changed its argument: %q, was %q", c.env, in)
			}
		})
	}
}

// TestAwake: schedtrace as the runtime reads it at start, the last entry
// whose value is an int32.
func TestAwake(t *testing.T) {
	for godebug, want := range map[string]bool{
		"":                           false,
		Setting:                      true,
		"schedtrace=0":               false,
		"x=1,schedtrace=1000":        true,
		"schedtrace=5,schedtrace=x":  true, // the runtime ignores the value that does not parse
		"schedtrace=5,schedtrace=0":  false,
		"schedtrace=99999999999":     false, // not an int32: ignored
		"noschedtrace=1,schedtrace=": false,
	} {
		t.Setenv("GODEBUG", godebug)
		if got := Awake(); got != want {
			t.Errorf("GODEBUG=%q: Awake() = %v, want %v", godebug, got, want)
		}
	}
}

// helperEnv makes the test binary act as a program that calls Reexec.
const helperEnv = "MCPHEAL_SYSMON_HELPER"

// TestMain is the helper program: it prints its PID, GODEBUG, whether
// sysmon is awake and MCPHEAL_SYSMON_MARK, calls Reexec, and prints what
// Reexec returned (if it returned).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		comm, _ := os.ReadFile("/proc/self/comm") // Linux: what ps and pgrep match
		fmt.Printf("start %d %q awake=%v mark=%s comm=%s\n", os.Getpid(), os.Getenv("GODEBUG"), Awake(),
			os.Getenv("MCPHEAL_SYSMON_MARK"), strings.TrimSpace(string(comm)))
		err := Reexec()
		fmt.Printf("returned %d %v\n", os.Getpid(), err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReexec runs the helper: without schedtrace in GODEBUG it starts
// again as the same process with Setting added and the rest of its
// environment kept; with schedtrace set by the operator it does not.
func TestReexec(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		godebug string
		want    []string // %[1]d is the helper's PID, %[2]s its name
	}{
		{"other settings", "http2client=0", []string{
			`start %[1]d "http2client=0" awake=false mark=kept comm=%[2]s`,
			`start %[1]d "http2client=0,` + Setting + `" awake=true mark=kept comm=%[2]s`,
			`returned %[1]d <nil>`,
		}},
		{"operator's schedtrace=0", "schedtrace=0", []string{
			`start %[1]d "schedtrace=0" awake=false mark=kept comm=%[2]s`,
			`returned %[1]d <nil>`,
		}},
		{"operator's own period", "schedtrace=60000", []string{
			`start %[1]d "schedtrace=60000" awake=true mark=kept comm=%[2]s`,
			`returned %[1]d <nil>`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
				return strings.HasPrefix(kv, "GODEBUG=") || strings.HasPrefix(kv, "MCPHEAL_SYSMON_REEXEC=")
			}),
				helperEnv+"=1", "MCPHEAL_SYSMON_MARK=kept", "GODEBUG="+c.godebug)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			comm := "" // /proc/self/comm: the name the kernel gives the process, at most 15 bytes
			if runtime.GOOS == "linux" {
				if comm = filepath.Base(os.Args[0]); len(comm) > 15 {
					comm = comm[:15]
				}
			}
			var pid int
			if _, err := fmt.Sscanf(lines[0], "start %d", &pid); err != nil {
				t.Fatalf("helper printed %q", out)
			}
			want := make([]string, len(c.want))
			for i, w := range c.want {
				want[i] = fmt.Sprintf(w, pid, comm)
			}
			if !slices.Equal(lines, want) {
				t.Errorf("helper printed\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
