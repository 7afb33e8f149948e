package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// printFuncs prints, for each data-plane file on a path, the functions
// with a block that ran more often in with than in without: what the turn
// enters the file for.
func printFuncs(w io.Writer, name string, without, with map[string]int64) {
	lines := map[string][]int{} // module-relative file → first lines of its blocks that ran more
	for block, n := range with {
		if n <= without[block] {
			continue
		}
		file, pos, _ := strings.Cut(block, ":")
		file = strings.TrimPrefix(file, module+"/")
		if !dataPlane(file) {
			continue
		}
		line, _, _ := strings.Cut(pos, ".")
		if l, err := strconv.Atoi(line); err == nil {
			lines[file] = append(lines[file], l)
		}
	}
	fmt.Fprintf(w, "\n%s, by function:\n", name)
	for _, file := range slices.Sorted(maps.Keys(lines)) {
		fmt.Fprintf(w, "  %s: %s\n", file, strings.Join(enclosingFuncs(file, lines[file]), " "))
	}
}

// enclosingFuncs names the functions of file (relative to the working
// directory, the module's root) that hold the given lines.
func enclosingFuncs(file string, lines []int) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	seen := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		from, to := fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line
		for _, l := range lines {
			if l >= from && l <= to {
				seen[funcName(fd)] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
