// Command healcover reports what a heal runs: given the coverage profiles
// (go test -covermode=count) of a run without a heal and of the same run
// with one (proxy/footprint_test.go), it lists the code blocks the second
// ran more often than the first, and counts their files, functions and
// lines. bench/healcover.sh runs it.
package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// block is one line of a coverage profile: a span of a file.
type block struct {
	file               string
	startLine, endLine int
	startCol, endCol   int
	stmts              int
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: healcover MODULE_DIR BASE_PROFILE HEAL_PROFILE")
		os.Exit(2)
	}
	root := os.Args[1]
	base, err := read(os.Args[2])
	check(err)
	heal, err := read(os.Args[3])
	check(err)
	module, err := modulePath(root)
	check(err)
	files := map[string]bool{}
	lines := map[string]bool{}
	funcs := map[string]bool{}
	whole := measure{files: map[string]bool{}, lines: map[string]bool{}, funcs: map[string]bool{}}
	bodies := map[string]*ast.File{}
	fset := token.NewFileSet()
	only := map[string]bool{} // files with a block that ran only in the heal
	for b, n := range heal {
		rel := strings.TrimPrefix(strings.TrimPrefix(b.file, module), "/")
		if n > 0 && b.stmts > 0 {
			whole.add(fset, bodies, root, rel, b)
		}
		if n <= base[b] || b.stmts == 0 {
			continue
		}
		if base[b] == 0 {
			only[rel] = true
		}
		files[rel] = true
		for l := b.startLine; l <= b.endLine; l++ {
			lines[rel+":"+strconv.Itoa(l)] = true
		}
		f, ok := bodies[rel]
		if !ok {
			f, err = parser.ParseFile(fset, filepath.Join(root, rel), nil, 0)
			check(err)
			bodies[rel] = f
		}
		if name := enclosing(fset, f, b.startLine); name != "" {
			funcs[rel+":"+name] = true
		}
	}
	byDir := map[string]int{}
	for f := range files {
		byDir[filepath.Dir(f)]++
	}
	fmt.Printf("a heal runs %d files, %d functions, %d lines more often than a call without one; %d files hold code only a heal runs\n",
		len(files), len(funcs), len(lines), len(only))
	fmt.Printf("the whole healing request runs %d files, %d functions, %d lines\n", len(whole.files), len(whole.funcs), len(whole.lines))
	for _, d := range slices.Sorted(maps.Keys(byDir)) {
		fmt.Printf("  %-24s %d files\n", d+"/", byDir[d])
	}
	fmt.Println("files (* holds code only a heal runs):")
	for _, f := range slices.Sorted(maps.Keys(files)) {
		var names []string
		for fn := range funcs {
			if name, ok := strings.CutPrefix(fn, f+":"); ok {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		mark := " "
		if only[f] {
			mark = "*"
		}
		n := 0
		for l := range lines {
			if strings.HasPrefix(l, f+":") {
				n++
			}
		}
		fmt.Printf("%s %-28s %3d lines: %s\n", mark, f, n, strings.Join(names, " "))
	}
}

// measure is what a set of blocks spans: files, functions, lines.
type measure struct{ files, lines, funcs map[string]bool }

// add counts block b of the file rel (relative to root) in m.
func (m *measure) add(fset *token.FileSet, bodies map[string]*ast.File, root, rel string, b block) {
	m.files[rel] = true
	for l := b.startLine; l <= b.endLine; l++ {
		m.lines[rel+":"+strconv.Itoa(l)] = true
	}
	f, ok := bodies[rel]
	if !ok {
		var err error
		f, err = parser.ParseFile(fset, filepath.Join(root, rel), nil, 0)
		check(err)
		bodies[rel] = f
	}
	if name := enclosing(fset, f, b.startLine); name != "" {
		m.funcs[rel+":"+name] = true
	}
}

// read parses a coverage profile into each block's count (the most of any
// line naming it: -coverpkg lists a block once per test binary).
func read(path string) (map[block]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[block]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file.go:12.3,14.5 2 7
		colon := strings.LastIndex(line, ":")
		fields := strings.Fields(line[colon+1:])
		if colon < 0 || len(fields) != 3 {
			return nil, fmt.Errorf("%s: bad line %q", path, line)
		}
		var b block
		b.file = line[:colon]
		if _, err := fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.startLine, &b.startCol, &b.endLine, &b.endCol); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		b.stmts, _ = strconv.Atoi(fields[1])
		n, _ := strconv.Atoi(fields[2])
		out[b] = max(out[b], n)
	}
	return out, sc.Err()
}

// enclosing names the function or method of f that holds line.
func enclosing(fset *token.FileSet, f *ast.File, line int) string {
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fset.Position(fd.Pos()).Line > line || fset.Position(fd.End()).Line < line {
			continue
		}
		if fd.Recv != nil && len(fd.Recv.List) > 0 {
			return types(fd.Recv.List[0].Type) + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
	return ""
}

// types names a receiver's type.
func types(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return types(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return types(t.X)
	}
	return "?"
}

// modulePath reads the module path of the go.mod in root.
func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "module "); ok {
			return strings.TrimSpace(p), nil
		}
	}
	return "", fmt.Errorf("no module line in %s/go.mod", root)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "healcover:", err)
		os.Exit(1)
	}
}
