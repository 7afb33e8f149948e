package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/controlplanetest"
)

// --check-config makes the checks a start makes, and fails with the same
// reason: a read-only data dir (a read-only tmpfs: as root a chmod would
// not stop the write), a corrupt policy.json, a file where the data dir
// should be, an unreachable Redis. A start on the same configuration fails
// naming the same cause.
func TestCheckConfigTellsTheTruth(t *testing.T) {
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1"})
	readOnly := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(readOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	controlplanetest.MountTmpfs(t, readOnly, 1<<20, true)
	corrupt := t.TempDir()
	writeFile(t, corrupt, "policy.json", `{"format":1,"version":1,"accounts":{`, 0o600)
	notDir := writeFile(t, t.TempDir(), "data", "a file, not a directory", 0o600)

	tests := []struct {
		name  string
		args  []string
		want  string
		start bool // a start fails the same way
	}{
		{"read-only data dir", []string{"--data-dir", readOnly}, "data dir is read-only", true},
		{"corrupt policy file", []string{"--data-dir", corrupt}, "parse policy file " + filepath.Join(corrupt, "policy.json"), true},
		{"data dir is a file", []string{"--data-dir", notDir}, "not a directory", true},
		{"data dir under a read-only one", []string{"--data-dir", filepath.Join(readOnly, "sub", "data")}, "data dir is read-only", true},
		{"redis unreachable", []string{"--redis", "redis://127.0.0.1:1", "--redis-timeout", "50ms"}, "check redis redis://127.0.0.1:1: unreachable", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := runEnv(t.Context(), append([]string{"--check-config"}, tt.args...), env, &out, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) || out.String() != "" {
				t.Errorf("--check-config = %q, %v; want an error containing %q and no \"configuration ok\"", out.String(), err, tt.want)
			}
			if !tt.start {
				return
			}
			err = runEnv(t.Context(), append([]string{"--listen", "127.0.0.1:0"}, tt.args...), env, io.Discard, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("start = %v, want an error containing %q", err, tt.want)
			}
		})
	}

	// A data dir that does not exist yet under a writable parent is fine,
	// and the check does not create it.
	missing := filepath.Join(t.TempDir(), "new", "data")
	var out bytes.Buffer
	if err := runEnv(t.Context(), []string{"--check-config", "--data-dir", missing}, env, &out, io.Discard, nil); err != nil || out.String() != "configuration ok\n" {
		t.Errorf("--check-config with a data dir to create = %q, %v; want ok", out.String(), err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("--check-config created %s (stat: %v)", missing, err)
	}
}
