package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// repoRoot is the repository's root, seen from this package's directory
// (go test runs a test in its package's directory).
const repoRoot = "../.."

// TestREADMEBlockIsTheProgram fails if the first ```go block of README.md is
// not, byte for byte, this package's main.go: the program a reader copies
// from the front page is the one TestREADMEProgramRuns runs.
func TestREADMEBlockIsTheProgram(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	block, line, ok := firstGoBlock(string(readme))
	if !ok {
		t.Fatal("README.md has no ```go block; its first one must be examples/readme/main.go")
	}
	if block == string(program) {
		return
	}
	t.Errorf("README.md's first ```go block (from line %d) is not examples/readme/main.go: %s\n"+
		"Edit examples/readme/main.go, run this test, then copy the file into README.md.",
		line, firstDifference(block, string(program), line))
}

// firstGoBlock returns the body of the first fenced ```go block in text, and
// the README line its body starts on.
func firstGoBlock(text string) (body string, line int, ok bool) {
	const open = "```go\n"
	i := strings.Index(text, open)
	if i < 0 || (i > 0 && text[i-1] != '\n') {
		return "", 0, false
	}
	rest := text[i+len(open):]
	j := strings.Index(rest, "\n```\n")
	if j < 0 {
		return "", 0, false
	}
	return rest[:j+1], strings.Count(text[:i], "\n") + 2, true
}

// firstDifference names the first line on which the README's block and
// main.go differ.
func firstDifference(block, program string, firstLine int) string {
	b, p := strings.SplitAfter(block, "\n"), strings.SplitAfter(program, "\n")
	for i := 0; i < len(b) || i < len(p); i++ {
		var bl, pl string
		if i < len(b) {
			bl = b[i]
		}
		if i < len(p) {
			pl = p[i]
		}
		if bl != pl {
			return fmt.Sprintf("first difference at README.md:%d (main.go:%d)\n  README.md: %q\n  main.go:   %q",
				firstLine+i, i+1, bl, pl)
		}
	}
	return "no line differs (line endings?)"
}

// TestREADMEProgramRuns runs the README's program as a reader would (go run,
// no servers) and checks what it prints: B's write accepted with token 2,
// A's stale write with token 1 rejected.
func TestREADMEProgramRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "run", ".")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./readme: %v\n%s", err, stderr.String())
	}
	const want = `stored B's invoice with token 2
A rejected: true
fencing: resource "invoices/2026-11": token 1 rejected, token 2 was already accepted: stale fencing token
`
	if got := stdout.String(); got != want {
		t.Errorf("go run ./readme printed\n%s\nwant\n%s", got, want)
	}
}
