package release_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

const rootModule = "github.com/dlock-go/dlock"

// TestInstall serves every published module of the checkout, at the version
// versions.yaml gives, from a file-based module proxy, and then does what a
// user does, in a clean GOPATH and module cache: go install the command, and
// go get the library and a driver in a new module and run README's program.
// Third-party modules come from the usual proxy (go env GOPROXY).
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads every dependency of dlock into an empty module cache")
	}
	repo := repoRoot(t)
	set := readVersions(t, repo)
	proxy := t.TempDir()
	for _, m := range set.Modules {
		serveModule(t, proxy, repo, m, set.Version, nil)
	}
	env := userEnv(t, proxy)

	t.Run("GoInstallCommand", func(t *testing.T) {
		bin := filepath.Join(env.home, "bin")
		if out, err := env.goCmd(t, env.home, "install", "github.com/dlock-go/dlock/cmd/dlock@"+set.Version); err != nil {
			t.Fatalf("go install github.com/dlock-go/dlock/cmd/dlock@%s: %v\n%s", set.Version, err, out)
		}
		out, err := exec.Command(filepath.Join(bin, "dlock"), "version").CombinedOutput()
		if err != nil {
			t.Fatalf("dlock version: %v\n%s", err, out)
		}
		if got, want := strings.TrimSpace(string(out)), "dlock "+set.Version; got != want {
			t.Errorf("dlock version printed %q, want %q", got, want)
		}
		if out, err := exec.Command(filepath.Join(bin, "dlock"), "help").CombinedOutput(); err != nil || !strings.Contains(string(out), "dlock run") {
			t.Errorf("dlock help: %v\n%s", err, out)
		}
	})

	t.Run("GoGetAndRunREADME", func(t *testing.T) {
		dir := filepath.Join(env.home, "app")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		program := readmeProgram(t, repo)
		writeFile(t, filepath.Join(dir, "main.go"), program)
		// One driver from a nested module (etcd) and one from the root
		// (zookeeper), and the ZooKeeper client they are built with, which
		// a program can import to make its own connection.
		writeFile(t, filepath.Join(dir, "drivers.go"), []byte(`package main

import (
	_ "github.com/dlock-go/dlock/etcd"
	_ "github.com/dlock-go/dlock/zookeeper"

	"github.com/dlock-go/dlock/third_party/zk"
)

var _ = zk.Connect
`))
		steps := [][]string{
			{"mod", "init", "example.com/app"},
			{"get", rootModule + "@" + set.Version, rootModule + "/etcd@" + set.Version},
		}
		for _, args := range steps {
			if out, err := env.goCmd(t, dir, args...); err != nil {
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		out, err := env.goCmd(t, dir, "run", ".")
		if err != nil {
			t.Fatalf("go run . (README's program): %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "A rejected: true") {
			t.Errorf("README's program printed:\n%s\nwant a line %q", out, "A rejected: true")
		}

		// The program builds with dlock's own copy of the ZooKeeper client,
		// which has the data race of go-zookeeper v1.0.4 fixed, and never with
		// the upstream module; and with the released dlock modules, not a
		// replacement.
		out, err = env.goCmd(t, dir, "list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}@{{.Version}}{{with .Replace}} => {{.Path}}{{end}}{{end}}", ".")
		if err != nil {
			t.Fatalf("go list -deps: %v\n%s", err, out)
		}
		deps := string(out)
		if !strings.Contains(deps, "github.com/dlock-go/dlock/third_party/zk "+rootModule+"@"+set.Version+"\n") {
			t.Errorf("the program does not build with github.com/dlock-go/dlock/third_party/zk from %s@%s:\n%s", rootModule, set.Version, deps)
		}
		for _, line := range strings.Split(deps, "\n") {
			if strings.Contains(line, "github.com/go-zookeeper/zk") || strings.Contains(line, "=>") {
				t.Errorf("go list -deps: %s", line)
			}
		}
	})
}

// TestInstallRefusesReplace shows that TestInstall's go install fails as it
// should: served with a replace line left in its go.mod, the command's module
// cannot be installed with go install …@version.
func TestInstallRefusesReplace(t *testing.T) {
	repo := repoRoot(t)
	set := readVersions(t, repo)
	proxy := t.TempDir()
	withReplace := func(gomod []byte) []byte {
		return append(gomod, "\nreplace github.com/dlock-go/dlock => ../..\n"...)
	}
	serveModule(t, proxy, repo, rootModule+"/cmd/dlock", set.Version, withReplace)
	env := userEnv(t, proxy)
	out, err := env.goCmd(t, env.home, "install", "github.com/dlock-go/dlock/cmd/dlock@"+set.Version)
	if err == nil {
		t.Fatalf("go install of a module with a replace line succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "replace directives") {
		t.Fatalf("go install failed, but not for the replace line: %v\n%s", err, out)
	}
	t.Logf("go install refused, as it should:\n%s", out)
}

// moduleSet is the one module set of versions.yaml.
type moduleSet struct {
	Version string   `yaml:"version"`
	Modules []string `yaml:"modules"`
}

// readVersions returns the module set of the repository's versions.yaml, and
// checks that the file has exactly one.
func readVersions(t *testing.T, repo string) moduleSet {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "versions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		ModuleSets map[string]moduleSet `yaml:"module-sets"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("versions.yaml: %v", err)
	}
	if len(v.ModuleSets) != 1 {
		t.Fatalf("versions.yaml has %d module sets, want 1 (every published module is versioned together)", len(v.ModuleSets))
	}
	for _, s := range v.ModuleSets {
		if len(s.Modules) == 0 || !strings.HasPrefix(s.Version, "v") {
			t.Fatalf("versions.yaml: module set %+v", s)
		}
		return s
	}
	panic("unreachable")
}

// repoRoot returns the repository's top directory, two levels above this
// module.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "versions.yaml")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serveModule writes the module modPath of the checkout at repo to the file
// proxy dir as version, with the files a tag of the current tree would
// publish (tracked and untracked files, not ignored ones). edit, if not nil,
// rewrites its go.mod.
func serveModule(t *testing.T, dir, repo, modPath, version string, edit func([]byte) []byte) {
	t.Helper()
	src := filepath.Join(repo, filepath.FromSlash(strings.TrimPrefix(strings.TrimPrefix(modPath, rootModule), "/")))
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		gomod = edit(gomod)
	}
	escaped, err := module.EscapePath(modPath)
	if err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := moduleFiles(src)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		if f.Path() == "go.mod" {
			files[i] = dataFile{name: "go.mod", data: gomod}
		}
	}
	var zbuf bytes.Buffer
	if err := modzip.Create(&zbuf, module.Version{Path: modPath, Version: version}, files); err != nil {
		t.Fatalf("zip of %s: %v", modPath, err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(vdir, version+".zip"), zbuf.Bytes())
	writeFile(t, filepath.Join(vdir, version+".mod"), gomod)
	writeFile(t, filepath.Join(vdir, version+".info"), info)
	writeFile(t, filepath.Join(vdir, "list"), []byte(version+"\n"))
}

// moduleFiles lists the files of the module in dir as git sees them: tracked
// ones and untracked ones that are not ignored, with their working-tree
// contents. modzip.Create leaves out those of nested modules.
func moduleFiles(dir string) ([]modzip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", dir, err)
	}
	var files []modzip.File
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		p := filepath.Join(dir, filepath.FromSlash(name))
		info, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			return nil, err
		}
		files = append(files, osFile{name: path.Clean(name), path: p, info: info})
	}
	return files, nil
}

type osFile struct {
	name, path string
	info       fs.FileInfo
}

func (f osFile) Path() string                 { return f.name }
func (f osFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f osFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }

type dataFile struct {
	name string
	data []byte
}

func (f dataFile) Path() string                 { return f.name }
func (f dataFile) Lstat() (fs.FileInfo, error)  { return dataInfo(f), nil }
func (f dataFile) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(f.data)), nil }

type dataInfo dataFile

func (i dataInfo) Name() string       { return path.Base(i.name) }
func (i dataInfo) Size() int64        { return int64(len(i.data)) }
func (i dataInfo) Mode() fs.FileMode  { return 0o644 }
func (i dataInfo) ModTime() time.Time { return time.Time{} }
func (i dataInfo) IsDir() bool        { return false }
func (i dataInfo) Sys() any           { return nil }

// goEnv is the environment of a user who has never built dlock: a new GOPATH
// and an empty module cache, dlock's modules from the file proxy and every
// other module from the usual proxy.
type goEnv struct {
	home string // a scratch directory: GOPATH is home/gopath, GOBIN home/bin
	env  []string
}

func userEnv(t *testing.T, proxy string) goEnv {
	t.Helper()
	home := t.TempDir()
	out, err := exec.Command("go", "env", "GOPROXY", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(vals) != 2 {
		t.Fatalf("go env GOPROXY GOCACHE printed %q", out)
	}
	upstream, gocache := vals[0], vals[1]
	gopath := filepath.Join(home, "gopath")
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GOPATH", "GOMODCACHE", "GOBIN", "GOPROXY", "GONOPROXY", "GONOSUMDB", "GOPRIVATE", "GOFLAGS", "GOWORK", "GOENV", "GOTOOLCHAIN":
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"GOENV=off", // the developer's go env -w settings are not the user's
		"GOPATH="+gopath,
		"GOMODCACHE="+filepath.Join(gopath, "pkg", "mod"), // empty
		"GOCACHE="+gocache, // build results only: reused, for speed
		"GOBIN="+filepath.Join(home, "bin"),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+","+upstream,
		// dlock's modules here are not the published ones: do not check
		// them against the checksum database. Every other module is.
		"GONOSUMDB="+rootModule,
		// The go command's defaults otherwise (no -mod=mod: a user has
		// none); -modcacherw lets t.TempDir remove the module cache.
		"GOFLAGS=-modcacherw",
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	)
	return goEnv{home: home, env: env}
}

// goCmd runs go args in dir and returns its combined output.
func (e goEnv) goCmd(t *testing.T, dir string, args ...string) ([]byte, error) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = e.env
	out, err := cmd.CombinedOutput()
	t.Logf("go %s: %v", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
	return out, err
}

// readmeProgram returns README.md's first Go code block: the program
// examples/readme/main.go.
func readmeProgram(t *testing.T, repo string) []byte {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```go block")
	}
	return m[1]
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
