package dlock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportedNamesDocumented fails for any exported name, in any public
// package of every module in the repository, without a doc comment.
func TestExportedNamesDocumented(t *testing.T) {
	for _, line := range goListAll(t, `{{.Dir}}|{{.ImportPath}}|{{join .GoFiles ","}}`) {
		parts := strings.SplitN(line, "|", 3)
		dir, path, files := parts[0], parts[1], parts[2]
		if strings.Contains(path, "/internal/") || strings.Contains(path, "/examples/") {
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
