package dlock_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestExportedNamesDocumented fails for any exported name, in any public
// package of every module in the repository, without a doc comment.
func TestExportedNamesDocumented(t *testing.T) {
	for _, line := range goListAll(t, `{{.Dir}}|{{.ImportPath}}|{{join .GoFiles ","}}`) {
		parts := strings.SplitN(line, "|", 3)
		dir, path, files := parts[0], parts[1], parts[2]
		if strings.Contains(path, "/internal/") || strings.Contains(path, "/examples/") || strings.Contains(path, "/third_party/") {
			continue
		}
		fset := token.NewFileSet()
		for _, name := range strings.Split(files, ",") {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, fset, f)
		}
	}
}

func checkFile(t *testing.T, fset *token.FileSet, f *ast.File) {
	undocumented := func(pos token.Pos, what string) {
		t.Errorf("%s: exported %s has no doc comment", fset.Position(pos), what)
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil {
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if id, ok := recv.(*ast.Ident); ok && !id.IsExported() {
					continue // method of an unexported type
				}
			}
			undocumented(d.Pos(), "func "+d.Name.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && d.Doc == nil {
						undocumented(s.Pos(), "type "+s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && s.Doc == nil && d.Doc == nil && s.Comment == nil {
							undocumented(n.Pos(), "name "+n.Name)
						}
					}
				}
			}
		}
	}
}

// historyPhrase matches a comment that tells history (a CI run, a test
// failure, a measurement once taken, an earlier version, a commit, a date)
// instead of the contract or the reason. Comments are matched with their line
// breaks turned to spaces, so a phrase may span lines.
var historyPhrase = regexp.MustCompile(`(?i)` + strings.Join([]string{
	`\bCI (on|runs?|saw|once|failed|caught|found|showed|printed)\b`,
	`\b(in|failed|failing|on|under load in) CI([^=\w]|$)`, // "on CI=true" names a setting, not a run
	`\(CI[:,)]`,
	`\b(this|a|one|that|an earlier) (working )?session (measured|saw|found|ran|showed|observed)\b`,
	`\b(measured|seen|saw|found) in (a|one|this|that) (working )?session\b`,
	`\bcommit [0-9a-f]{7,40}\b`,
	`\bwas measured\b`,
	`\bmeasured (once|here)\b`,
	`\bflak(ed|es|y|iness)\b`,
	`\bseen (failing|to fail)\b`,
	`\b(seen|observed) (on|in|under) an? (loaded|busy|slow)\b`,
	`\bseen (reproducing|while running|when running)\b`,
	`\b[0-9]+ times in [0-9]+\b`,
	`\bin a throwaway (test|benchmark|run)\b`,
	`\b(failed|failing) once\b`,
	`\bonce failed\b`,
	`\bTest[A-Z][A-Za-z0-9_/-]* (saw|caught|showed|failed|found|flaked|printed)\b`,
	`\b(in|before|since|until) (an? |the )?(earlier|previous|prior|older) (version|release)s?\b`,
	`\bwas (once|formerly|previously)\b`,
	`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`,
}, "|"))

// TestDocCommentsStateContracts fails for any comment in the Go files (tests
// aside) of any public package of every module, doc comments of exported
// names and package docs included, that cites a CI run or a test failure as
// history: a comment states the contract or the reason; reasoning goes to
// docs/, history to commit messages. It logs the doc-comment lines per
// exported name of each package.
func TestDocCommentsStateContracts(t *testing.T) {
	var figures []string
	for _, line := range goListAll(t, `{{.Dir}}|{{.ImportPath}}|{{join .GoFiles ","}}`) {
		parts := strings.SplitN(line, "|", 3)
		dir, path, files := parts[0], parts[1], parts[2]
		if strings.Contains(path, "/internal/") || strings.Contains(path, "/examples/") {
			continue
		}
		fset := token.NewFileSet()
		var names, lines int
		for _, name := range strings.Split(files, ",") {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			docOf := map[*ast.CommentGroup]string{}
			for _, d := range exportedDocs(f) {
				if d.counted {
					names++
					lines += d.lines
				}
				if d.doc != nil {
					docOf[d.doc] = "the doc comment of " + d.name
				}
			}
			for _, c := range f.Comments {
				text := strings.Join(strings.Fields(c.Text()), " ")
				if m := historyPhrase.FindString(text); m != "" {
					what := docOf[c]
					if what == "" {
						what = "a comment"
					}
					t.Errorf("%s: %s tells history (%q): state the contract or the reason; reasoning goes to docs/, history to the commit message",
						fset.Position(c.Pos()), what, m)
				}
			}
		}
		if names > 0 {
			figures = append(figures, fmt.Sprintf("%-40s %4d names %5d lines %5.2f lines/name", path, names, lines, float64(lines)/float64(names)))
		}
	}
	sort.Strings(figures)
	t.Logf("doc-comment lines per exported name:\n%s", strings.Join(figures, "\n"))
}

// maxRootDocLinesPerName bounds the root package's average doc-comment lines
// per exported name, and maxRootDocLines any one name's. A contract (what a
// name does, its defaults, its errors) takes one to three sentences: one or
// two lines for most names, so an average above 2 means comments have become
// essays again; 6 lines leave room for the few names with several errors
// (Do, AcquireAll, Lease.Release). etcd's clientv3/concurrency averages
// under 1.
const (
	maxRootDocLinesPerName = 2.0
	maxRootDocLines        = 6
)

// TestRootDocCommentsAreShort fails if the root package's doc comments
// average more than maxRootDocLinesPerName lines per exported name (top-level
// names and methods, counted as TestDocCommentsStateContracts counts them), or
// if any one is longer than maxRootDocLines. Reasoning belongs in docs/.
func TestRootDocCommentsAreShort(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names, lines int
	var long, longest []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range exportedDocs(f) {
			if !d.counted {
				continue
			}
			names++
			lines += d.lines
			if d.lines > 2 {
				longest = append(longest, fmt.Sprintf("%2d %s", d.lines, d.name))
			}
			if d.lines > maxRootDocLines {
				long = append(long, fmt.Sprintf("%s: the doc comment of %s has %d lines", fset.Position(d.doc.Pos()), d.name, d.lines))
			}
		}
	}
	if names == 0 {
		t.Fatal("found no exported names in the root package")
	}
	avg := float64(lines) / float64(names)
	t.Logf("root package: %d exported names, %d doc-comment lines, %.2f lines/name", names, lines, avg)
	for _, l := range long {
		t.Errorf("%s, at most %d: state the contract; reasoning goes to docs/", l, maxRootDocLines)
	}
	if avg > maxRootDocLinesPerName {
		sort.Sort(sort.Reverse(sort.StringSlice(longest)))
		t.Errorf("the root's doc comments average %.2f lines per exported name, at most %.1f: state the contract; reasoning goes to docs/; the names of more than 2 lines:\n%s",
			avg, maxRootDocLinesPerName, strings.Join(longest, "\n"))
	}
}

// exportedDoc is one doc comment of an exported name (or the package).
type exportedDoc struct {
	name    string
	doc     *ast.CommentGroup
	lines   int  // lines of the comment
	counted bool // a top-level name or method: counts in the figure per name
}

// exportedDocs returns the doc comments in f of the package, its exported
// top-level names and methods, their exported fields and interface methods.
func exportedDocs(f *ast.File) []exportedDoc {
	var out []exportedDoc
	add := func(name string, doc *ast.CommentGroup, counted bool) {
		n := 0
		if doc != nil {
			n = len(doc.List)
			if n == 1 {
				n = strings.Count(doc.List[0].Text, "\n") + 1 // a /* */ comment
			}
		}
		if doc != nil || counted {
			out = append(out, exportedDoc{name: name, doc: doc, lines: n, counted: counted})
		}
	}
	if f.Doc != nil {
		add("package "+f.Name.Name, f.Doc, false)
	}
	fields := func(owner string, fl *ast.FieldList) {
		if fl == nil {
			return
		}
		for _, fd := range fl.List {
			for _, n := range fd.Names {
				if n.IsExported() && fd.Doc != nil {
					add(owner+"."+n.Name, fd.Doc, false)
				}
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil {
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if ix, ok := recv.(*ast.IndexExpr); ok {
					recv = ix.X
				}
				if ix, ok := recv.(*ast.IndexListExpr); ok {
					recv = ix.X
				}
				id, ok := recv.(*ast.Ident)
				if !ok || !id.IsExported() {
					continue
				}
				name = id.Name + "." + name
			}
			add(name, d.Doc, true)
		case *ast.GenDecl:
			groupDone := false
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					doc := s.Doc
					if doc == nil && len(d.Specs) == 1 {
						doc = d.Doc
					}
					add(s.Name.Name, doc, true)
					switch ty := s.Type.(type) {
					case *ast.StructType:
						fields(s.Name.Name, ty.Fields)
					case *ast.InterfaceType:
						fields(s.Name.Name, ty.Methods)
					}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						doc := s.Doc
						if doc == nil {
							doc = s.Comment
						}
						if doc == nil && d.Doc != nil && !groupDone {
							doc = d.Doc // a group's doc counts once
							groupDone = true
						} else if doc != nil && i > 0 {
							doc = nil // a spec of several names counts its doc once
						}
						add(n.Name, doc, true)
					}
				}
			}
		}
	}
	return out
}
