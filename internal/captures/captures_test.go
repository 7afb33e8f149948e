package captures

import (
	"encoding/json"
	"io/fs"
	"strings"
	"testing"
)

// Every JSON capture parses, and both client folders are present: a
// capture that was truncated or lost in a copy fails here, not in the test
// that happens to read it.
func TestCapturesParse(t *testing.T) {
	seen := map[string]int{}
	err := fs.WalkDir(FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		seen[strings.SplitN(path, "/", 2)[0]]++
		b, err := ReadFile(path)
		if err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(path, ".json"):
			if !json.Valid(b) {
				t.Errorf("%s is not valid JSON", path)
			}
		case strings.HasSuffix(path, ".jsonl"):
			for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if !json.Valid([]byte(line)) {
					t.Errorf("%s line %d is not valid JSON", path, i+1)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen["claude-code"] < 30 || seen["codex"] < 10 {
		t.Fatalf("captures per folder = %v; want at least 30 claude-code and 10 codex files", seen)
	}
	if _, err := ReadFile("claude-code/no-such-file.json"); err == nil || !strings.Contains(err.Error(), "no-such-file.json") {
		t.Fatalf("ReadFile of a missing capture: err = %v; want an error naming the file", err)
	}
}
