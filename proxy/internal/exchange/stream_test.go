package exchange

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestAnswerStreamNeverReachesItsAttempt: the answer stream and its faces
// (the upstream side, the bodies fasthttp writes, the idle writer) read the
// call they answer and nothing else of the attempt: no method of theirs
// names Attempt, and they reach the attempt only to give it back when the
// answer is written (owner.Release).
// The compiler keeps the rest: from a *answerStream only the call's fields
// and the stream's own are in reach.
func TestAnswerStreamNeverReachesItsAttempt(t *testing.T) {
	faces := map[string]bool{"answerStream": true, "upstreamStream": true, "sseBody": true, "jsonBody": true, "idleWriter": true}
	fset := token.NewFileSet()
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	methods := 0
	for _, e := range files {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || !faces[recvType(fd)] {
				continue
			}
			methods++
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && k.Name == "owner" {
						return false // reset keeps it
					}
				case *ast.Ident:
					if n.Name == "Attempt" {
						t.Errorf("%s: %s.%s names the Attempt", fset.Position(n.Pos()), recvType(fd), fd.Name.Name)
					}
				case *ast.SelectorExpr:
					if n.Sel.Name == "owner" {
						if p, ok := parentCall(fd.Body, n); !ok || p != "Release" {
							t.Errorf("%s: %s.%s uses its owner for more than Release", fset.Position(n.Pos()), recvType(fd), fd.Name.Name)
						}
					}
				}
				return true
			})
		}
	}
	if methods < 30 {
		t.Fatalf("found %d methods of the answer stream and its faces: the test no longer finds them", methods)
	}
}

// recvType is the name of fd's receiver type.
func recvType(fd *ast.FuncDecl) string {
	x := fd.Recv.List[0].Type
	if s, ok := x.(*ast.StarExpr); ok {
		x = s.X
	}
	if id, ok := x.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// parentCall returns the method called on sel (sel.M(...)) within body.
func parentCall(body *ast.BlockStmt, sel *ast.SelectorExpr) (string, bool) {
	var name string
	ast.Inspect(body, func(n ast.Node) bool {
		if outer, ok := n.(*ast.SelectorExpr); ok && outer.X == sel {
			name = outer.Sel.Name
			return false
		}
		return name == ""
	})
	return name, name != ""
}
