package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// flagsDoc is the reference that holds the flags (README "Documentation").
const flagsDoc = "docs/configuration.md"

// regenerateFlags is the command that rewrites the flag reference from the
// binary: the fenced block after the "Flags" heading becomes what `mcpheal
// --help` prints.
const regenerateFlags = "go run . --help 2>&1 | awk 'NR==FNR{h=h $0 \"\\n\"; next} /^#+ Flags$/{f=1} f==1 && /^```/{print; printf \"%s\", h; f=2; skip=1; next} skip && /^```$/{skip=0} !skip' - " + flagsDoc + " > " + flagsDoc + ".new && mv " + flagsDoc + ".new " + flagsDoc

// TestREADMEFlags: the flag reference (the fenced block under the "Flags"
// heading of docs/configuration.md) is exactly what `mcpheal --help` prints, usage lines,
// every flag, its help text and its default. It runs the same code as the
// binary (cli with --help), so a flag added to or changed in main.go, or a
// default moved, fails here until the block is regenerated.
func TestREADMEFlags(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	if code := cli(context.Background(), []string{"--help"}, io.Discard, &help); code != 0 {
		t.Fatalf("mcpheal --help exited %d:\n%s", code, help.String())
	}
	readme, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatal(err)
	}
	block, first, err := flagsBlock(string(readme))
	if err != nil {
		t.Fatalf("%s: %v\nregenerate it with: %s", flagsDoc, err, regenerateFlags)
	}
	if msg := firstDifference(block, help.String(), first); msg != "" {
		t.Errorf("%s's flag reference is not what `mcpheal --help` prints:\n%s\n"+
			"The block must be regenerated from the binary whenever main.go's flags change; regenerate it with:\n  %s",
			flagsDoc, msg, regenerateFlags)
	}
}

// TestREADMELanding: the README is a landing page (at most 300 lines) and
// every relative link in it and in docs/ names a file that exists, so
// that moving a reference never leaves a link behind.
func TestREADMELanding(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 300 {
		t.Errorf("README.md has %d lines; a landing page has at most 300 (the reference goes to docs/)", n)
	}
	docs, _ := filepath.Glob("docs/*.md")
	if len(docs) < 8 {
		t.Fatalf("docs/ holds %d files", len(docs))
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
				t.Errorf("%s links %s, which does not exist", f, m[1])
			}
		}
	}
}

var flagsHeading = regexp.MustCompile(`^#{2,6} Flags\s*$`)

// flagsBlock returns the contents of the first fenced block after the
// docs/configuration.md's "Flags" heading (each line with its newline) and the README line
// number of its first line.
func flagsBlock(readme string) (string, int, error) {
	lines := strings.SplitAfter(readme, "\n")
	h := -1
	for i, l := range lines {
		if flagsHeading.MatchString(strings.TrimRight(l, "\n")) {
			h = i
			break
		}
	}
	if h < 0 {
		return "", 0, fmt.Errorf("no \"Flags\" heading")
	}
	open := -1
	for i := h + 1; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], "\n")
		if strings.HasPrefix(l, "```") {
			open = i
			break
		}
		if strings.HasPrefix(l, "#") {
			return "", 0, fmt.Errorf("no fenced block under the \"Flags\" heading (line %d) before the next heading (line %d)", h+1, i+1)
		}
	}
	if open < 0 {
		return "", 0, fmt.Errorf("no fenced block under the \"Flags\" heading (line %d)", h+1)
	}
	for i := open + 1; i < len(lines); i++ {
		if strings.TrimRight(lines[i], "\n") == "```" {
			return strings.Join(lines[open+1:i], ""), open + 2, nil
		}
	}
	return "", 0, fmt.Errorf("the fenced block under the \"Flags\" heading (line %d) is not closed", open+1)
}

// firstDifference compares the README's block with the help text line by
// line and names the first line that differs ("" when they are equal).
// first is the README line number of the block's first line.
func firstDifference(block, help string, first int) string {
	got := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
	want := strings.Split(strings.TrimSuffix(help, "\n"), "\n")
	differ, at := 0, -1
	for i := range max(len(got), len(want)) {
		if i < len(got) && i < len(want) && got[i] == want[i] {
			continue
		}
		differ++
		if at < 0 {
			at = i
		}
	}
	if at < 0 {
		return ""
	}
	show := func(lines []string, i int, which string) string {
		if i >= len(lines) {
			return "(nothing: " + which + " ends before this line)"
		}
		return fmt.Sprintf("%q", lines[i])
	}
	return fmt.Sprintf("  first difference at "+flagsDoc+":%d, line %d of the block (the block has %d lines, --help prints %d; %d differ by position):\n"+
		"    README:         %s\n"+
		"    mcpheal --help: %s",
		first+at, at+1, len(got), len(want), differ, show(got, at, "the README's block"), show(want, at, "--help"))
}
