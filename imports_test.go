package dlock_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// modules returns the directory of every Go module in the repository: the
// root and the nested ones (etcd, nats, migrate, dlockotel, cmd/dlock,
// examples, bench, internal/release).
func modules(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 8 {
		t.Fatalf("found the modules %v; want the root and its seven nested modules", dirs)
	}
	return dirs
}

// goListAll runs go list -f format ./... in every module of the repository
// and returns the output lines. It uses the repository's go.work, which sends
// the versions of dlock's modules that the nested ones require to the working
// copies (the go.mod files have no replace lines).
func goListAll(t *testing.T, format string) []string {
	t.Helper()
	work, err := filepath.Abs("go.work")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, dir := range modules(t) {
		cmd := exec.Command("go", "list", "-f", format, "./...")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+work)
		// stdout only: on a fresh machine stderr carries "go: downloading"
		// lines, which are not packages.
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
		}
		lines = append(lines, strings.Split(strings.TrimSpace(string(out)), "\n")...)
	}
	return lines
}

// TestRootModuleStaysLean keeps the root module's go.mod free of the heavy
// modules a user of one driver should never take part in version selection
// for: the etcd server and its storage, consensus and metrics stacks, and
// NATS's client. They belong to the nested modules (etcd, nats, migrate,
// cmd/dlock, examples, bench).
func TestRootModuleStaysLean(t *testing.T) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, heavy := range []string{"go.etcd.io/", "google.golang.org/grpc", "go.uber.org/zap", "go.opentelemetry.io/otel/sdk", "github.com/prometheus/", "github.com/Shopify/toxiproxy", "github.com/nats-io/", "k8s.io/"} {
		if strings.Contains(string(gomod), heavy) {
			t.Errorf("the root go.mod requires %s: move the code that needs it to a nested module", heavy)
		}
	}
}

// TestZooKeeperClientIsTheCopy: dlock's ZooKeeper code builds with the copy
// of go-zookeeper v1.0.4 in third_party/zk, which fixes a data race (see its
// README), and never with the upstream module: no module of the repository
// requires or replaces github.com/go-zookeeper/zk, and no package, test
// included, imports it. A replace line would reach only dlock's own builds; an
// import of the copy reaches every program that uses dlock.
func TestZooKeeperClientIsTheCopy(t *testing.T) {
	const upstream = "github.com/go-zookeeper/zk"
	for _, dir := range modules(t) {
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(gomod), upstream) {
			t.Errorf("%s/go.mod names %s: import github.com/dlock-go/dlock/third_party/zk instead", dir, upstream)
		}
	}
	imports := 0
	for _, line := range goListAll(t, `{{.ImportPath}}|{{join .Imports ","}},{{join .TestImports ","}},{{join .XTestImports ","}}`) {
		pkg, imps, _ := strings.Cut(line, "|")
		for _, imp := range strings.Split(imps, ",") {
			switch imp {
			case upstream:
				t.Errorf("%s imports %s: import github.com/dlock-go/dlock/third_party/zk instead", pkg, upstream)
			case "github.com/dlock-go/dlock/third_party/zk":
				imports++
			}
		}
	}
	if imports == 0 {
		t.Error("no package imports github.com/dlock-go/dlock/third_party/zk: is the zookeeper driver still listed?")
	}
}

// TestImportRules enforces the import rules of docs/DESIGN.md with go list: the root
// imports only backend, observe, internal/clock, internal/sharedctx and
// internal/mode/hook; backend and observe only the standard library; internal/clock and internal/sockstate only the standard library and x/sys;
// internal/sharedctx and internal/sqlstate only the standard library; drivers never import each other; conformance never imports a driver
// nor internal/testenv;
// examples never import internal/.
func TestImportRules(t *testing.T) {
	const mod = "github.com/dlock-go/dlock"
	drivers := map[string]bool{mod + "/redis": true, mod + "/redlock": true, mod + "/etcd": true,
		mod + "/zookeeper": true, mod + "/postgres": true, mod + "/sqltable": true, mod + "/mysql": true, mod + "/memlock": true,
		mod + "/nats": true, mod + "/k8s": true}
	checked := 0
	for _, line := range goListAll(t, `{{.ImportPath}}|{{join .Imports ","}}`) {
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
			case pkg == mod && strings.HasPrefix(imp, mod) && imp != mod+"/backend" && imp != mod+"/internal/clock" && imp != mod+"/internal/sharedctx" && imp != mod+"/internal/mode/hook" && imp != mod+"/observe":
				t.Errorf("%s imports %s: the root may import only backend, observe, internal/clock, internal/sharedctx and internal/mode/hook (mem:// is registered by importing memlock)", pkg, imp)
			case (pkg == mod+"/internal/sharedctx" || pkg == mod+"/internal/sqlstate" || pkg == mod+"/internal/mode/hook") && !stdlib:
				t.Errorf("%s imports %s: %s may import only the standard library", pkg, imp, pkg)
			case (pkg == mod+"/internal/clock" || pkg == mod+"/internal/sockstate") && !stdlib && imp != "golang.org/x/sys/unix":
				t.Errorf("%s imports %s: %s may import only the standard library and x/sys", pkg, imp, pkg)
			case (pkg == mod+"/backend" || pkg == mod+"/observe") && !stdlib:
				t.Errorf("%s imports %s: %s may import only the standard library", pkg, imp, pkg)
			case drivers[pkg] && drivers[imp]:
				t.Errorf("driver %s imports driver %s", pkg, imp)
			case pkg == mod+"/election" && strings.HasPrefix(imp, mod) && imp != mod:
				t.Errorf("%s imports %s: %s is built on the public API alone (the root)", pkg, imp, pkg)
			case pkg == mod+"/semaphore" && strings.HasPrefix(imp, mod) && imp != mod && imp != mod+"/internal/mode":
				t.Errorf("%s imports %s: semaphore is built on the root and its counted mode (internal/mode) alone", pkg, imp)
			case pkg == mod+"/rwlock" && strings.HasPrefix(imp, mod) && imp != mod && imp != mod+"/semaphore" && imp != mod+"/internal/mode":
				t.Errorf("%s imports %s: rwlock is built on the root, semaphore and its shared mode (internal/mode) alone", pkg, imp)
			case pkg == mod+"/internal/mode" && strings.HasPrefix(imp, mod) && imp != mod && imp != mod+"/internal/mode/hook":
				t.Errorf("%s imports %s: internal/mode imports only the root and internal/mode/hook", pkg, imp)
			case pkg == mod+"/conformance" && drivers[imp]:
				t.Errorf("conformance imports driver %s", imp)
			case pkg == mod+"/conformance" && imp == mod+"/internal/testenv":
				t.Errorf("conformance imports %s: cmd/dlock imports conformance, so it must build on every platform, and testenv is Unix only", imp)
			case strings.HasPrefix(pkg, mod+"/examples/") && strings.HasPrefix(imp, mod+"/internal/"):
				t.Errorf("example %s imports %s", pkg, imp)
			}
		}
		if drivers[pkg] && pkg != mod+"/memlock" {
			for _, imp := range internal {
				if imp != mod && imp != mod+"/backend" && !strings.HasPrefix(imp, mod+"/internal/") && imp != mod+"/third_party/zk" {
					t.Errorf("driver %s imports %s: drivers import only the root, backend and their client library (for zookeeper, third_party/zk)", pkg, imp)
				}
			}
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("go list reported only %d packages", checked)
	}
}
