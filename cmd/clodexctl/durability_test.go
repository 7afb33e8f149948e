package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
)

// What an operator sees of a store that lost data and of a record that
// does not decode, and backup and restore as commands, against a replica
// over a real Redis with the credential broker.
func TestStoreLossBackupAndRestoreCommands(t *testing.T) {
	rs := redistest.Start(t)
	srv := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "cp-1", Broker: true})
	opt, _ := redis.ParseURL(rs.URL)
	raw := redis.NewClient(opt)
	defer raw.Close()
	ctx := t.Context()
	if _, _, err := ctl(t, srv, "set-rate", acct1, "600"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "team.cbk")
	out, _, err := ctl(t, srv, "backup", "--out", file)
	if err != nil || !strings.Contains(out, "wrote "+file) || !strings.Contains(out, "sealed with the control plane's credential key") || !strings.Contains(out, "1 policies") {
		t.Fatalf("backup = %q, %v", out, err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	if _, _, err := ctl(t, srv, "backup"); err == nil || exitCode(err) != 2 {
		t.Errorf("backup without --out = %v; want a usage error", err)
	}

	// A FLUSHALL: health, top and get say what was lost and restored.
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, err = ctl(t, srv, "health")
		if err == nil && strings.Contains(out, "restored at") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health after a FLUSHALL = %q, %v; want the loss and the restore", out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(out, "SERVING") || !strings.Contains(out, "store: LOST DATA at ") || !strings.Contains(out, "epoch") {
		t.Errorf("health = %q; want SERVING and the loss named", out)
	}
	out, _, err = ctl(t, srv, "top", "--once", "--interval", "500ms")
	if err != nil || !strings.Contains(out, "LOST DATA at ") || !strings.Contains(out, "restored at") {
		t.Errorf("top = %q, %v; want the loss and the restore in its store line", out, err)
	}
	out, _, err = ctl(t, srv, "get", acct1)
	if err != nil || !strings.Contains(out, "600/min") {
		t.Errorf("get after the loss = %q, %v; want the rate 600 back", out, err)
	}

	// A garbage policy: get, accounts and top show it unreadable, with
	// its key, and the last good rate.
	key := account.Key(acct1)
	if err := raw.HSet(ctx, "clodex:policies", key, "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	out, _, err = ctl(t, srv, "get", acct1)
	if err != nil || !strings.Contains(out, "UNREADABLE") || !strings.Contains(out, "clodex:policies field "+key) || !strings.Contains(out, "600/min") {
		t.Errorf("get with a garbage policy = %q, %v; want it unreadable, named, at the last good 600/min", out, err)
	}
	out, _, err = ctl(t, srv, "accounts")
	if err != nil || !strings.Contains(out, "unreadable: "+key+": ") {
		t.Errorf("accounts = %q, %v; want the unreadable account listed with its key", out, err)
	}
	out, _, err = ctl(t, srv, "top", "--once", "--interval", "500ms")
	if err != nil || !strings.Contains(out, key+" UNREADABLE") {
		t.Errorf("top = %q, %v; want the account marked unreadable", out, err)
	}

	// restore keeps the newer record (set-rate 300 after the backup) and
	// --force writes the backup's.
	if _, _, err := ctl(t, srv, "set-rate", acct1, "300"); err != nil {
		t.Fatal(err)
	}
	out, _, err = ctl(t, srv, "restore", file)
	if err != nil || !strings.Contains(out, "policies 0 restored, 1 kept") {
		t.Errorf("restore = %q, %v; want the newer policy kept", out, err)
	}
	out, _, err = ctl(t, srv, "restore", file, "--force")
	if err != nil || !strings.Contains(out, "policies 1 restored, 0 kept") {
		t.Errorf("restore --force = %q, %v", out, err)
	}
	if out, _, _ := ctl(t, srv, "get", acct1); !strings.Contains(out, "600/min") {
		t.Errorf("get after restore --force = %q; want 600/min", out)
	}
	bad := filepath.Join(t.TempDir(), "bad.cbk")
	if err := os.WriteFile(bad, []byte("not a backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl(t, srv, "restore", bad); err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "not a clodex backup file") {
		t.Errorf("restore of a file that is no backup = %v; want a usage error naming it", err)
	}
}

// backup and restore work on one control plane over its data dir too:
// the file is plain without a credential key (it holds no sign-ins), and
// a restore puts back what was changed since, when forced.
func TestBackupAndRestoreOnTheDataDir(t *testing.T) {
	srv := startServer(t)
	if _, _, err := ctl(t, srv, "set-rate", acct1, "120"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl(t, srv, "member", "create", "alice", "--rate", "3", "--out", filepath.Join(t.TempDir(), "alice.key")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dir.cbk")
	out, _, err := ctl(t, srv, "backup", "--out", file, "-o", "json")
	if err != nil || !strings.Contains(out, `"kind": "memory"`) || !strings.Contains(out, `"policies": 1`) || !strings.Contains(out, `"members": 1`) ||
		!strings.Contains(out, `"sealed": false`) {
		t.Fatalf("backup = %q, %v", out, err)
	}
	// A member removed since the backup comes back with it.
	if _, _, err := ctl(t, srv, "member", "remove", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl(t, srv, "set-rate", acct1, "30"); err != nil {
		t.Fatal(err)
	}
	if out, _, err := ctl(t, srv, "restore", file); err != nil || !strings.Contains(out, "policies 0 restored, 1 kept") ||
		!strings.Contains(out, "members 1 restored, 0 kept") {
		t.Errorf("restore = %q, %v; want the newer policy kept and the member back", out, err)
	}
	if out, _, _ := ctl(t, srv, "member", "list"); !strings.Contains(out, "alice") || !strings.Contains(out, "3/min") {
		t.Errorf("member list after the restore = %q; want alice at 3/min", out)
	}
	if out, _, err := ctl(t, srv, "restore", file, "--force"); err != nil || !strings.Contains(out, "policies 1 restored") {
		t.Errorf("restore --force = %q, %v", out, err)
	}
	if out, _, _ := ctl(t, srv, "get", acct1); !strings.Contains(out, "120/min") {
		t.Errorf("get after restore --force = %q; want 120/min", out)
	}
	srv.Restart()
	if out, _, _ := ctl(t, srv, "get", acct1); !strings.Contains(out, "120/min") {
		t.Errorf("get after a restart = %q; want the restored 120/min kept in policy.json", out)
	}
}
