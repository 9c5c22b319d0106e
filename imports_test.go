package dlock_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules enforces the import rules of DESIGN.md with go list: the root
// imports only backend (and internal/memlock); backend only the standard
// library; drivers never import each other; conformance never imports a driver;
// examples never import internal/.
func TestImportRules(t *testing.T) {
	const mod = "github.com/dlock-go/dlock"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports ","}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	drivers := map[string]bool{mod + "/redis": true, mod + "/redlock": true, mod + "/etcd": true,
		mod + "/zookeeper": true, mod + "/postgres": true, mod + "/internal/memlock": true}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(line, "|")
		var internal []string
		for _, imp := range strings.Split(imps, ",") {
			if imp == "" {
				continue
			}
			if strings.HasPrefix(imp, mod) {
				internal = append(internal, imp)
			}
			stdlib := !strings.Contains(strings.SplitN(imp, "/", 2)[0], ".")
			switch {
			case pkg == mod && strings.HasPrefix(imp, mod) && imp != mod+"/backend" && imp != mod+"/internal/memlock":
				t.Errorf("%s imports %s: the root may import only backend and internal/memlock", pkg, imp)
			case pkg == mod+"/backend" && !stdlib:
				t.Errorf("%s imports %s: backend may import only the standard library", pkg, imp)
			case drivers[pkg] && drivers[imp]:
				t.Errorf("driver %s imports driver %s", pkg, imp)
			case pkg == mod+"/conformance" && drivers[imp]:
				t.Errorf("conformance imports driver %s", imp)
			case strings.HasPrefix(pkg, mod+"/examples/") && strings.HasPrefix(imp, mod+"/internal/"):
				t.Errorf("example %s imports %s", pkg, imp)
			}
		}
		if drivers[pkg] && pkg != mod+"/internal/memlock" {
			for _, imp := range internal {
				if imp != mod && imp != mod+"/backend" && !strings.HasPrefix(imp, mod+"/internal/") {
					t.Errorf("driver %s imports %s: drivers import only the root, backend and their client library", pkg, imp)
				}
			}
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("go list reported only %d packages", checked)
	}
}
