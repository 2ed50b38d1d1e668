package doctor

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDependencies keeps the doctor independent of the proxy (doc.go): of
// the project's packages it may use only classify, classify/sse and
// upstream/login.
func TestDependencies(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/mcpheal/mcpheal/"
	allowed := map[string]bool{
		module + "classify":       true,
		module + "classify/sse":   true,
		module + "proxy/doctor":   true,
		module + "upstream/login": true, // how a server authenticates (Report.Auth)
	}
	for _, path := range strings.Fields(string(out)) {
		if strings.HasPrefix(path, module) && !allowed[path] {
			t.Errorf("doctor depends on %s; of the project it may use only classify, classify/sse and upstream/login", path)
		}
	}
}
