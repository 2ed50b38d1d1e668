package classify

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// allowedImports are the only non-standard packages classify may depend on,
// directly or not: its own SSE sub-package, the one home of
// the SSE line rules, and gjson, which it does not use today (see doc.go).
var allowedImports = map[string]bool{
	"github.com/mcpheal/mcpheal/classify/sse": true,
	"github.com/tidwall/gjson":                true,
	"github.com/tidwall/match":                true, // gjson's own dependencies
	"github.com/tidwall/pretty":               true,
}

// TestDependencies keeps classify a leaf: the standard library, classify/sse,
// and at most gjson. Test files are not part of the build list checked here.
func TestDependencies(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	self, err := exec.Command(goTool, "list", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	me := strings.TrimSpace(string(self))
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, std, _ := strings.Cut(line, " ")
		if std == "true" || path == me {
			continue
		}
		if !allowedImports[path] {
			t.Errorf("classify depends on %s; only the standard library, classify/sse and gjson are allowed", path)
		}
	}
}
