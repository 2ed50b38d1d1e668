package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// shippedGODEBUG is what the image and the Kubernetes examples set (docs/performance.md
// "Performance"): schedtrace's longest period, in milliseconds (an int32).
const shippedGODEBUG = "schedtrace=2147483647"

// TestSysmonAwake: schedtrace as the runtime reads it at start
// (runtime/runtime1.go, parsegodebug), the last entry whose value is an
// int32.
func TestSysmonAwake(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		godebug string
		want    bool
	}{
		{"", false},
		{shippedGODEBUG, true},
		{"schedtrace=1", true},
		{"schedtrace=0", false},
		{"schedtrace=-1", false},
		{"http2client=0", false},
		{"http2client=0," + shippedGODEBUG, true},
		{"x=1,schedtrace=1000,y=2", true},
		{"schedtrace=5,schedtrace=0", false},          // the last one wins
		{"schedtrace=0,schedtrace=5", true},           // the last one wins
		{"schedtrace=5,schedtrace=x", true},           // a value that does not parse is ignored
		{"schedtrace=5,schedtrace=", true},            // an empty one too
		{"schedtrace=2147483648", false},              // not an int32: ignored
		{"schedtrace=5,schedtrace=99999999999", true}, // and does not undo the one before
		{"schedtrace=+7", true},                       // the runtime's ParseInt takes a sign
		{"schedtrace=1_000", false},                   // but no underscores in base 10
		{"noschedtrace=1", false},
		{"schedtrace", false},
		{" schedtrace=1", false}, // keys are not trimmed
		{"scheddetail=1", false}, // detail alone: sysmon still parks (runtime/proc.go, func sysmon)
	} {
		if got := sysmonAwake(c.godebug); got != c.want {
			t.Errorf("sysmonAwake(%q) = %v, want %v", c.godebug, got, c.want)
		}
	}
}

// TestShippedGODEBUG: the image (the Dockerfile's last stage) and every
// mcpheal container of examples/kubernetes run with shippedGODEBUG, as
// docs/performance.md "Performance" says.
func TestShippedGODEBUG(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var image []string // GODEBUG values set by ENV in the last stage
	for l := range strings.Lines(string(df)) {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && strings.EqualFold(f[0], "FROM"):
			image = nil
		case len(f) > 1 && strings.EqualFold(f[0], "ENV"):
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
					image = append(image, v)
				}
			}
		}
	}
	if len(image) != 1 || image[0] != shippedGODEBUG {
		t.Errorf("the image sets GODEBUG %q, want %q once", image, shippedGODEBUG)
	}

	files, err := filepath.Glob("examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples/kubernetes/*.yaml (%v)", err)
	}
	type container struct {
		Name  string `yaml:"name"`
		Image string `yaml:"image"`
		Env   []struct {
			Name  string `yaml:"name"`
			Value string `yaml:"value"`
		} `yaml:"env"`
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		n := 0
		for {
			var doc struct {
				Spec struct {
					Template struct {
						Spec struct {
							InitContainers []container `yaml:"initContainers"`
							Containers     []container `yaml:"containers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			pod := doc.Spec.Template.Spec
			for _, c := range append(pod.InitContainers, pod.Containers...) {
				if !strings.Contains(c.Image, "mcpheal") {
					continue
				}
				n++
				var got []string
				for _, e := range c.Env {
					if e.Name == "GODEBUG" {
						got = append(got, e.Value)
					}
				}
				if len(got) != 1 || got[0] != shippedGODEBUG {
					t.Errorf("%s: container %s sets GODEBUG %q, want %q once", file, c.Name, got, shippedGODEBUG)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no mcpheal container", file)
		}
	}
}
