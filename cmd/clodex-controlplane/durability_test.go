package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func keyFile(t *testing.T, dir, name string) string {
	t.Helper()
	_, b64, err := broker.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, name, b64+"\n", 0o600)
}

// A replica with a valid but different credential key refuses to start,
// and --check-config fails, naming the key file: on the data dir and over
// Redis. The right key passes both.
func TestWrongCredentialKeyIsRefused(t *testing.T) {
	rs := redistest.Start(t)
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1"})
	keys := t.TempDir()
	right, wrong := keyFile(t, keys, "right.key"), keyFile(t, keys, "wrong.key")
	for name, storeArgs := range map[string][]string{
		"data dir": {"--data-dir", t.TempDir()},
		"redis":    {"--redis", rs.URL, "--replica", "cp-1"},
	} {
		t.Run(name, func(t *testing.T) {
			r := start(t, append([]string{"--listen", "127.0.0.1:0", "--credential-key-file", right}, storeArgs...), env)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := runEnv(t.Context(), append([]string{"--check-config", "--credential-key-file", wrong}, storeArgs...), env, &out, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), "--credential-key-file "+wrong) || !strings.Contains(err.Error(), "sealed with another key") {
				t.Errorf("--check-config with another key = %q, %v; want an error naming %s", out.String(), err, wrong)
			}
			err = runEnv(t.Context(), append([]string{"--listen", "127.0.0.1:0", "--credential-key-file", wrong}, storeArgs...), env, io.Discard, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), wrong) {
				t.Errorf("start with another key = %v; want it refused naming %s", err, wrong)
			}
			out.Reset()
			if err := runEnv(t.Context(), append([]string{"--check-config", "--credential-key-file", right}, storeArgs...), env, &out, io.Discard, nil); err != nil {
				t.Errorf("--check-config with the right key = %v", err)
			}
		})
	}
}

// --rotate-credential-key re-seals every sign-in under the new key and
// exits; a start with the old key is refused after it, with the new key
// the sign-in opens.
func TestRotateCredentialKey(t *testing.T) {
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1"})
	dir, keys := t.TempDir(), t.TempDir()
	oldKey, newKey := keyFile(t, keys, "old.key"), keyFile(t, keys, "new.key")
	r := start(t, []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--credential-key-file", oldKey}, env)
	admin := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "admin-secret-1"))
	if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{AccessToken: "opaque-access", RefreshToken: "opaque-refresh", AccountId: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := runEnv(t.Context(), []string{"--data-dir", dir, "--credential-key-file", oldKey, "--rotate-credential-key", newKey}, env, &out, io.Discard, nil)
	if err != nil || !strings.Contains(out.String(), "re-sealed 1 sign-ins under "+newKey) {
		t.Fatalf("--rotate-credential-key = %q, %v", out.String(), err)
	}
	if err := runEnv(t.Context(), []string{"--check-config", "--data-dir", dir, "--credential-key-file", oldKey}, env, io.Discard, io.Discard, nil); err == nil {
		t.Error("--check-config with the old key after the rotation passed")
	}
	r = start(t, []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--credential-key-file", newKey}, env)
	got, err := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "admin-secret-1")).ListLogins(t.Context(), &controlplanev1.ListLoginsRequest{})
	if err != nil || len(got.GetLogins()) != 1 || got.GetLogins()[0].GetRefreshes() != 0 {
		t.Errorf("ListLogins under the new key = %v, %v; want the sign-in, never refreshed", got, err)
	}
}

// --check-config and the start warn when Redis keeps nothing on disk and
// when replicas keep no backups, saying plainly that sign-ins live there.
func TestPersistenceWarnings(t *testing.T) {
	rs := redistest.Start(t) // --appendonly no --save ""
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1"})
	var out, errOut bytes.Buffer
	if err := runEnv(t.Context(), []string{"--check-config", "--redis", rs.URL}, env, &out, &errOut, nil); err != nil || out.String() != "configuration ok\n" {
		t.Fatalf("--check-config = %q, %v", out.String(), err)
	}
	for _, want := range []string{"appendonly no", "the sign-ins (refresh tokens)", "no --backup-dir"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("--check-config output lacks %q:\n%s", want, errOut.String())
		}
	}
	r := start(t, []string{"--listen", "127.0.0.1:0", "--redis", rs.URL, "--replica", "cp-1"}, env)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.stderr.String(), "appendonly no") {
		t.Errorf("the start log lacks the persistence warning:\n%s", r.stderr.String())
	}
}

// With --backup-dir a change is backed up at once (sealed with the
// credential key, mode 0600), and a data dir found empty at the next
// start is restored from the newest backup, saying so.
func TestBackupDirRestoresAnEmptyDataDir(t *testing.T) {
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1"})
	dir, backups := t.TempDir(), filepath.Join(t.TempDir(), "backups")
	key := keyFile(t, t.TempDir(), "credential.key")
	args := []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--backup-dir", backups, "--credential-key-file", key}
	r := start(t, args, env)
	admin := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "admin-secret-1"))
	const acct = "acct_0123456789abcdef"
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: acct, RatePerMinute: 600}); err != nil {
		t.Fatal(err)
	}
	var files []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(backups, "clodex-backup-*.cbk"))
		if len(files) > 0 && newestHas(t, files, key, acct) {
			break
		}
	}
	if len(files) == 0 || !newestHas(t, files, key, acct) {
		t.Fatalf("no backup holding the change in %s: %v", backups, files)
	}
	if fi, err := os.Stat(files[len(files)-1]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"policy.json", "policy.json.bak"} {
		_ = os.Remove(filepath.Join(dir, f))
	}
	r = start(t, args, env)
	got, err := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "admin-secret-1")).GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: acct})
	if err != nil || got.GetAccount().GetRatePerMinute() != 600 || !strings.Contains(got.GetStore().GetRestored(), "backup") {
		t.Errorf("GetAccount after a start on an emptied data dir = %v, %v; want rate 600, restored from the backup", got, err)
	}
	if !strings.Contains(r.stderr.String(), "restored the policies from the newest backup") {
		t.Errorf("the start does not say it restored:\n%s", r.stderr.String())
	}
}

// newestHas reports whether the newest backup opens with the key in
// keyPath and holds acct's policy.
func newestHas(t *testing.T, files []string, keyPath, acct string) bool {
	t.Helper()
	k, err := broker.ReadKeyFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(files[len(files)-1])
	if err != nil || !store.IsSealedBackup(b) {
		return false
	}
	s, err := store.DecodeBackup(b, k.BackupSealer())
	return err == nil && s.Policies[acct].RatePerMinute == 600
}
