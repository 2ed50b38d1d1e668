package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// imageEnv returns the environment that the repository's Dockerfile gives
// the image it ships: the KEY=VALUE pairs of the ENV instructions of its
// last stage, in order. The harness starts mcpheal with them, so that what
// it measures is mcpheal as the image runs it (GODEBUG=schedtrace=2147483647:
// docs/deployment.md "Keeping the runtime's sysmon awake"). Only unquoted KEY=VALUE pairs are read; anything
// else in an ENV (quotes, escapes, variables, the legacy "ENV KEY VALUE"
// form) is an error rather than a guess.
func imageEnv(dockerfile string) ([]string, error) {
	var env []string
	lines := strings.Split(dockerfile, "\n")
	for i := 0; i < len(lines); i++ {
		n, l := i+1, strings.TrimSpace(lines[i])
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) { // a continued instruction
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM": // a new stage: what an earlier one set is not in the image
			env = nil
		case "ENV":
			if len(f) == 1 {
				return nil, fmt.Errorf("Dockerfile line %d: ENV without a value", n)
			}
			for _, kv := range f[1:] {
				k, _, ok := strings.Cut(kv, "=")
				if !ok || k == "" || strings.ContainsAny(kv, `"'\$`) {
					return nil, fmt.Errorf("Dockerfile line %d: ENV %s: mcpbench reads only unquoted KEY=VALUE pairs", n, kv)
				}
				env = append(env, kv)
			}
		}
	}
	return env, nil
}

// readImageEnv is imageEnv of the Dockerfile at the repository root.
func readImageEnv(root string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, fmt.Errorf("the image's environment: %w", err)
	}
	return imageEnv(string(b))
}

// runImageEnv is the "image-env" subcommand: the image's environment on one
// line, for env(1) (bench/syscalls.sh starts mcpheal with it).
func runImageEnv(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("image-env takes no arguments")
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	env, err := readImageEnv(root)
	if err != nil {
		return err
	}
	fmt.Println(strings.Join(env, " "))
	return nil
}
