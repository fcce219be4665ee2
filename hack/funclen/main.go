// Command funclen lists the functions of non-test Go files whose bodies are
// longer than a limit, longest first. Issue 12 asks for no non-test function
// over about 100 lines in pkg/; this is how that is measured.
//
//	go run ./hack/funclen [-min 100] [dir ...]   (default dir: pkg)
//
// A function's length is the number of lines from its `func` keyword to its
// closing brace, doc comment excluded. The exit status is 0 whatever it finds:
// it reports, it does not gate.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type function struct {
	file  string
	name  string
	lines int
}

func main() {
	minLines := flag.Int("min", 100, "list functions with at least this many lines")
	flag.Parse()
	dirs := flag.Args()
	if len(dirs) == 0 {
		dirs = []string{"pkg"}
	}
	var found []function
	for _, dir := range dirs {
		fns, err := measure(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "funclen:", err)
			os.Exit(2)
		}
		found = append(found, fns...)
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].lines != found[j].lines {
			return found[i].lines > found[j].lines
		}
		return found[i].file+found[i].name < found[j].file+found[j].name
	})
	for _, f := range found {
		if f.lines >= *minLines {
			fmt.Printf("%4d  %s  %s\n", f.lines, f.file, f.name)
		}
	}
}

// measure parses every non-test Go file under dir.
func measure(dir string) ([]function, error) {
	var out []function
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start := fset.Position(fn.Type.Func).Line
			end := fset.Position(fn.Body.Rbrace).Line
			out = append(out, function{file: path, name: funcName(fn), lines: end - start + 1})
		}
		return nil
	})
	return out, err
}

// funcName is Name or (Receiver).Name.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	recv := fn.Recv.List[0].Type
	if star, ok := recv.(*ast.StarExpr); ok {
		recv = star.X
	}
	if idx, ok := recv.(*ast.IndexExpr); ok {
		recv = idx.X
	}
	if id, ok := recv.(*ast.Ident); ok {
		return "(" + id.Name + ")." + fn.Name.Name
	}
	return fn.Name.Name
}
