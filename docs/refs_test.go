// Package docs holds the reference pages of clodex (the *.md files beside
// this one), the test that keeps the repository's citations of them true,
// and the test that keeps real credentials out of the repository
// (TestNoCommittedSecrets in secrets_test.go).
//
// TestRepositoryReferences fails when a file of the repository mentions a document
// outside the repository, cites a section of a docs page that does not
// exist (a citation "docs/X.md §N" needs a heading "## N." in docs/X.md), or
// links to a Markdown file or heading anchor that does not exist.
package docs_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// outside are strings that name documents outside the repository. They are
// assembled from parts so that this file does not contain them.
var outside = []string{
	".." + "/shared",
	"/work" + "/shared",
}

// staleCitations match citations of the design and behaviour notes the
// code was written from, which are not part of the repository. They are
// checked in source and documentation files only (captured client traffic
// is data and may say anything). key is a lowercase word every match
// contains, a cheap filter before the expression runs.
var staleCitations = []struct {
	key string
	re  *regexp.Regexp
}{
	{"behaviour", regexp.MustCompile(`(?i)clodex-` + `behaviour`)},
	{"clients", regexp.MustCompile(`(?i)real-` + `clients\.md`)},
	{"events", regexp.MustCompile(`(?i)backend-` + `events\.md`)},
	{"spec", regexp.MustCompile(`(?i)\bspec` + ` (section )?\d+(\.\d+)?`)},
	{"spec", regexp.MustCompile(`(?i)(^|[^\w-])spec` + `/`)},
	{"seed", regexp.MustCompile(`(?i)\bseed` + ` \d{3}\b`)},
	{"seed", regexp.MustCompile(`(?i)\bthe seed` + `'s\b`)},
}

// isSource reports whether a file is code, a script or documentation.
func isSource(p string) bool {
	switch path.Ext(p) {
	case ".go", ".md", ".sh", ".proto", ".yaml", ".yml":
		return true
	}
	return p == "Makefile" || p == ".ci/run"
}

var (
	// heading captures the section number of "## 3. Title" or "### 3.2 Title".
	heading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?[ \t]`)
	// anyHeading captures a Markdown heading's text.
	anyHeading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$`)
	// continuation joins a comment that wraps onto the next line.
	continuation = regexp.MustCompile(`\n[ \t]*(?://+|#+|\*)?[ \t]*`)
	// citation is "pool.md §3" or "docs/pool.md §3.2"; in a docs page a
	// bare "§3" cites the page itself.
	citation = regexp.MustCompile(`(?:((?:docs/)?[A-Za-z0-9_-]+\.md)[ \t]+)?§[ \t]?(\d+(?:\.\d+)*)`)
	// mdLink is the target of a Markdown link.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// sections returns the section numbers of a docs page.
func sections(page []byte) map[string]bool {
	out := map[string]bool{}
	for _, m := range heading.FindAllSubmatch(stripCode(page), -1) {
		out[string(m[1])] = true
	}
	return out
}

// slug is GitHub's anchor for a heading: lowercase, punctuation dropped,
// spaces turned into hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the heading anchors of a Markdown file, with GitHub's
// -1, -2 suffixes for repeated headings.
func anchors(md []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range anyHeading.FindAllSubmatch(stripCode(md), -1) {
		s := slug(string(m[1]))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// stripCode blanks fenced code blocks, whose lines are not headings.
func stripCode(md []byte) []byte {
	lines := bytes.Split(md, []byte("\n"))
	in := false
	for i, l := range lines {
		if bytes.HasPrefix(bytes.TrimSpace(l), []byte("```")) {
			in = !in
			lines[i] = nil
			continue
		}
		if in {
			lines[i] = nil
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

// check returns one line per problem in files (repository path → content).
// Docs pages are the files under docs/ ending in .md.
func check(files map[string][]byte) []string {
	var problems []string
	report := func(p, format string, args ...any) {
		problems = append(problems, p+": "+fmt.Sprintf(format, args...))
	}
	secs := map[string]map[string]bool{} // sections by page, computed once
	anchs := map[string]map[string]bool{}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	for _, p := range paths {
		data := files[p]
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		for _, s := range outside {
			if bytes.Contains(data, []byte(s)) {
				report(p, "mentions %q, a document outside the repository; cite docs/ instead", s)
			}
		}
		if isSource(p) {
			lower := bytes.ToLower(data)
			for _, sc := range staleCitations {
				if !bytes.Contains(lower, []byte(sc.key)) {
					continue
				}
				for _, loc := range sc.re.FindAllIndex(data, -1) {
					line := 1 + bytes.Count(data[:loc[0]], []byte("\n"))
					report(fmt.Sprintf("%s:%d", p, line), "cites %q, a document that is not in the repository; cite a docs/ section or state the rule",
						strings.TrimSpace(string(data[loc[0]:loc[1]])))
				}
			}
		}
		inDocs := strings.HasPrefix(p, "docs/") && path.Ext(p) == ".md"
		var text []byte
		if bytes.Contains(data, []byte("\u00a7")) {
			text = continuation.ReplaceAll(data, []byte(" "))
		}
		for _, m := range citation.FindAllSubmatch(text, -1) {
			page, sec := string(m[1]), string(m[2])
			switch {
			case page == "" && !inDocs:
				continue // a bare § outside the docs cites nothing we know
			case page == "":
				page = p
			case strings.HasPrefix(page, "docs/"):
			default:
				page = "docs/" + page
			}
			doc, ok := files[page]
			if !ok {
				report(p, "cites %s §%s, but %s does not exist", page, sec, page)
				continue
			}
			if secs[page] == nil {
				secs[page] = sections(doc)
			}
			if !secs[page][sec] {
				report(p, "cites %s §%s, but %s has no section %s", page, sec, page, sec)
			}
		}
		if path.Ext(p) == ".md" {
			for _, m := range mdLink.FindAllSubmatch(stripCode(data), -1) {
				target := string(m[1])
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := p
				if file != "" {
					dest = path.Clean(path.Join(path.Dir(p), file))
				}
				body, ok := files[dest]
				if !ok {
					if !dirExists(files, dest) {
						report(p, "links to %s, which does not exist", target)
					}
					continue
				}
				if anchor == "" || path.Ext(dest) != ".md" {
					continue
				}
				if anchs[dest] == nil {
					anchs[dest] = anchors(body)
				}
				if !anchs[dest][anchor] {
					report(p, "links to %s, but %s has no heading with anchor #%s", target, dest, anchor)
				}
			}
		}
	}
	return problems
}

// dirExists reports whether some file lives under dir.
func dirExists(files map[string][]byte, dir string) bool {
	for p := range files {
		if strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}

// repoFiles reads the repository's files as git lists them (tracked, and
// untracked ones that are not ignored, so new pages count before their
// first commit), or every file under the root when git cannot list them (a
// source archive).
func repoFiles(t *testing.T, root string) map[string][]byte {
	t.Helper()
	var list []string
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err == nil {
		for _, p := range strings.Split(string(out), "\x00") {
			if p != "" {
				list = append(list, p)
			}
		}
	} else {
		t.Logf("git ls-files failed (%v); checking every file under %s instead", err, root)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if d.IsDir() {
				if rel != "." && (strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci" || d.Name() == "bin") {
					return filepath.SkipDir
				}
				return nil
			}
			list = append(list, filepath.ToSlash(rel))
			return nil
		})
		if err != nil {
			t.Fatalf("list the repository's files: %v", err)
		}
	}
	files := make(map[string][]byte, len(list))
	for _, p := range list {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree, not yet committed
			}
			t.Fatalf("read %s: %v", p, err)
		}
		files[p] = data
	}
	return files
}

func TestRepositoryReferences(t *testing.T) {
	files := repoFiles(t, "..")
	if _, ok := files["docs/README.md"]; !ok {
		t.Fatalf("docs/README.md is missing from the %d files found; run the test from the docs directory of a clodex checkout", len(files))
	}
	for _, p := range check(files) {
		t.Error(p)
	}
}

// TestDocsIndexListsEveryPage checks that docs/README.md links every page.
func TestDocsIndexListsEveryPage(t *testing.T) {
	files := repoFiles(t, "..")
	index := string(files["docs/README.md"])
	for p := range files {
		if !strings.HasPrefix(p, "docs/") || path.Ext(p) != ".md" || p == "docs/README.md" {
			continue
		}
		if !strings.Contains(index, "]("+strings.TrimPrefix(p, "docs/")+")") {
			t.Errorf("docs/README.md does not link %s", p)
		}
	}
}

func TestCheckFindsProblems(t *testing.T) {
	// The citations below are assembled with sect so that this file does
	// not cite the repository's own pages.
	const sect = "\u00a7"
	page := []byte("# Pool\n\n## 1. Heads\n\n### 1.2 Digests\n\n## 3. Matching\n\n```\n## 9. not a heading\n```\n")
	tests := []struct {
		name string
		path string
		data string
		want []string
	}{
		{"valid Go citation", "a/a.go", "// See docs/pool.md " + sect + "3.", nil},
		{"valid subsection wrapped over a comment line", "a/a.go", "// the rule of docs/pool.md\n// " + sect + "1.2 applies", nil},
		{"missing section", "a/a.go", "// docs/pool.md " + sect + "4",
			[]string{"a/a.go: cites docs/pool.md " + sect + "4, but docs/pool.md has no section 4"}},
		{"section inside a code block", "a/a.go", "// docs/pool.md " + sect + "9",
			[]string{"a/a.go: cites docs/pool.md " + sect + "9, but docs/pool.md has no section 9"}},
		{"missing page", "a/a.go", "// docs/nope.md " + sect + "1",
			[]string{"a/a.go: cites docs/nope.md " + sect + "1, but docs/nope.md does not exist"}},
		{"outside document", "scripts/x.sh", "# see " + outside[1] + "/spec",
			[]string{`scripts/x.sh: mentions "` + outside[1] + `", a document outside the repository; cite docs/ instead`}},
		{"relative outside document", "README.md", "see " + outside[0] + "/seeds",
			[]string{`README.md: mentions "` + outside[0] + `", a document outside the repository; cite docs/ instead`}},
		{"stale spec citation", "a/a.go", "// (spec" + " 4.3)",
			[]string{`a/a.go:1: cites "spec` + ` 4.3", a document that is not in the repository; cite a docs/ section or state the rule`}},
		{"stale spec citation in data is ignored", "a/testdata/x.json", `{"text":"spec` + ` 4.3"}`, nil},
		{"bare section in a docs page", "docs/other.md", "# Other\n\n## 1. One\n\nSee " + sect + "1 and " + sect + "2.",
			[]string{"docs/other.md: cites docs/other.md " + sect + "2, but docs/other.md has no section 2"}},
		{"relative page citation in a docs page", "docs/other.md", "# Other\n\nSee [pool.md " + sect + "3](pool.md#3-matching).", nil},
		{"bad anchor", "docs/other.md", "# Other\n\nSee [x](pool.md#3-matchin).",
			[]string{"docs/other.md: links to pool.md#3-matchin, but docs/pool.md has no heading with anchor #3-matchin"}},
		{"missing link target", "README.md", "See [x](docs/gone.md).", []string{"README.md: links to docs/gone.md, which does not exist"}},
		{"directory link", "README.md", "See [docs](docs/).", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{"docs/pool.md": page, tt.path: []byte(tt.data)}
			got := check(files)
			if !slices.Equal(got, tt.want) {
				t.Errorf("check() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSlug(t *testing.T) {
	tests := []struct{ in, want string }{
		{"3. Exact-prefix matching", "3-exact-prefix-matching"},
		{"9.3 The end of a response", "93-the-end-of-a-response"},
		{"7. `prompt_cache_key`", "7-prompt_cache_key"},
		{"3. The system prompt → `instructions`", "3-the-system-prompt--instructions"},
		{"clodex-sim, the backend emulator", "clodex-sim-the-backend-emulator"},
	}
	for _, tt := range tests {
		if got := slug(tt.in); got != tt.want {
			t.Errorf("slug(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
