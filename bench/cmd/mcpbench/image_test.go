package main

import (
	"slices"
	"testing"
)

func TestImageEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, dockerfile string
		want             []string
		err              bool
	}{
		{"none", "FROM scratch\nCMD [\"/x\"]\n", nil, false},
		{"last stage only", "FROM golang AS build\nENV CGO_ENABLED=0\nFROM scratch\nENV GODEBUG=schedtrace=2147483647\n",
			[]string{"GODEBUG=schedtrace=2147483647"}, false},
		{"several, in order", "FROM scratch\nenv A=1 B=x=y\n# ENV C=3\nENV D=4 \\\n  E=5\n",
			[]string{"A=1", "B=x=y", "D=4", "E=5"}, false},
		{"legacy form", "FROM scratch\nENV GODEBUG schedtrace=1\n", nil, true},
		{"quoted", "FROM scratch\nENV A=\"1 2\"\n", nil, true},
		{"variable", "FROM scratch\nENV A=$B\n", nil, true},
		{"empty", "FROM scratch\nENV\n", nil, true},
	} {
		got, err := imageEnv(c.dockerfile)
		if (err != nil) != c.err || !slices.Equal(got, c.want) {
			t.Errorf("%s: imageEnv = %q, %v; want %q, error %v", c.name, got, err, c.want, c.err)
		}
	}
}

// TestRepositoryImageEnv: the repository's Dockerfile is one mcpbench can
// read, so bench/run.sh runs mcpheal as the image does.
func TestRepositoryImageEnv(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, err := readImageEnv(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(env) == 0 {
		t.Errorf("the Dockerfile's last stage sets no environment")
	}
}
