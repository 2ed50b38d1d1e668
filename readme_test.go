package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// regenerateFlags is the command that rewrites the README's flag reference
// from the binary: the fenced block after the "Flags" heading becomes what
// `mcpheal --help` prints.
const regenerateFlags = "go run . --help 2>&1 | awk 'NR==FNR{h=h $0 \"\\n\"; next} /^#+ Flags$/{f=1} f==1 && /^```/{print; printf \"%s\", h; f=2; skip=1; next} skip && /^```$/{skip=0} !skip' - README.md > README.md.new && mv README.md.new README.md"

// TestREADMEFlags: the README's flag reference (the fenced block under its
// "Flags" heading) is exactly what `mcpheal --help` prints, usage lines,
// every flag, its help text and its default. It runs the same code as the
// binary (cli with --help), so a flag added to or changed in main.go, or a
// default moved, fails here until the block is regenerated.
func TestREADMEFlags(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	if code := cli(context.Background(), []string{"--help"}, io.Discard, &help); code != 0 {
		t.Fatalf("mcpheal --help exited %d:\n%s", code, help.String())
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	block, first, err := flagsBlock(string(readme))
	if err != nil {
		t.Fatalf("README.md: %v\nregenerate it with: %s", err, regenerateFlags)
	}
	if msg := firstDifference(block, help.String(), first); msg != "" {
		t.Errorf("README.md's flag reference is not what `mcpheal --help` prints:\n%s\n"+
			"The block must be regenerated from the binary whenever main.go's flags change; regenerate it with:\n  %s",
			msg, regenerateFlags)
	}
}

var flagsHeading = regexp.MustCompile(`^#{2,6} Flags\s*$`)

// flagsBlock returns the contents of the first fenced block after the
// README's "Flags" heading (each line with its newline) and the README line
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
	return fmt.Sprintf("  first difference at README.md:%d, line %d of the block (the block has %d lines, --help prints %d; %d differ by position):\n"+
		"    README:         %s\n"+
		"    mcpheal --help: %s",
		first+at, at+1, len(got), len(want), differ, show(got, at, "the README's block"), show(want, at, "--help"))
}
