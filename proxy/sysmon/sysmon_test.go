package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestEnv(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  []string
		want []string
		add  bool
	}{
		{"no GODEBUG", []string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=" + Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + Setting, "A=1"}, true},
		{"other settings kept", []string{"GODEBUG=http2client=0"}, []string{"GODEBUG=http2client=0," + Setting}, true},
		{"operator's schedtrace=0 wins", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"operator's own period wins", []string{"GODEBUG=x=1,schedtrace=1000"}, []string{"GODEBUG=x=1,schedtrace=1000"}, false},
		{"a setting that only ends in schedtrace", []string{"GODEBUG=noschedtrace=1"}, []string{"GODEBUG=noschedtrace=1," + Setting}, true},
		{"first GODEBUG is the one read", []string{"GODEBUG=a=1", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=a=1," + Setting, "GODEBUG=schedtrace=0"}, true},
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

// helperEnv makes the test binary act as a program that calls Reexec.
const helperEnv = "MCPHEAL_SYSMON_HELPER"

// TestMain is the helper program: it prints its PID, GODEBUG, whether
// sysmon is awake and MCPHEAL_SYSMON_MARK, calls Reexec, and prints what
// Reexec returned (if it returned).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		fmt.Printf("start %d %q awake=%v mark=%s\n", os.Getpid(), os.Getenv("GODEBUG"), Awake(), os.Getenv("MCPHEAL_SYSMON_MARK"))
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
		want    []string // %d is the helper's PID
	}{
		{"other settings", "http2client=0", []string{
			`start %d "http2client=0" awake=false mark=kept`,
			`start %d "http2client=0,` + Setting + `" awake=true mark=kept`,
			`returned %d <nil>`,
		}},
		{"operator's schedtrace=0", "schedtrace=0", []string{
			`start %d "schedtrace=0" awake=false mark=kept`,
			`returned %d <nil>`,
		}},
		{"operator's own period", "schedtrace=60000", []string{
			`start %d "schedtrace=60000" awake=true mark=kept`,
			`returned %d <nil>`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }),
				helperEnv+"=1", "MCPHEAL_SYSMON_MARK=kept", "GODEBUG="+c.godebug)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			var pid int
			if _, err := fmt.Sscanf(lines[0], "start %d", &pid); err != nil {
				t.Fatalf("helper printed %q", out)
			}
			want := make([]string, len(c.want))
			for i, w := range c.want {
				want[i] = fmt.Sprintf(w, pid)
			}
			if !slices.Equal(lines, want) {
				t.Errorf("helper printed\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
