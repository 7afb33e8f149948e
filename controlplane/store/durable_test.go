package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// xorSealer is a Sealer for tests that must tell sealed from plain bytes;
// the broker's AES-GCM sealer is tested with the broker.
type xorSealer struct{}

func (xorSealer) Seal(p []byte) []byte {
	out := make([]byte, len(p))
	for i, b := range p {
		out[i] = b ^ 0x5a
	}
	return out
}

func (xorSealer) Open(s []byte) ([]byte, error) {
	out := xorSealer{}.Seal(s)
	if len(out) == 0 || out[0] != '{' {
		return nil, errors.New("does not open")
	}
	return out, nil
}

func sampleSnapshot() Snapshot {
	return Snapshot{
		Created: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), Kind: "redis", Replica: "cp-1", Epoch: "0123456789abcdef 1", Version: 7,
		Policies: map[string]PolicyRecord{key: NewPolicyRecord(pacing.Policy{RatePerMinute: 600, Burst: 20, Budget: pacing.DefaultBudget()}, false, 7)},
		Logins:   map[string]Login{key: {AccountID: "acct-1", Sealed: []byte("sealed"), Generation: 3}},
		AgentCreds: map[string]AgentCred{"team-a": {Digest: bytes.Repeat([]byte{1}, 32), Accounts: []string{key},
			Created: time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC), Version: 2}},
		Removed: map[string]int64{"login:acct_00000000000000b2": 4},
	}
}

func TestBackupRoundTrip(t *testing.T) {
	for _, sealer := range []Sealer{nil, xorSealer{}} {
		b, err := EncodeBackup(sampleSnapshot(), sealer)
		if err != nil {
			t.Fatal(err)
		}
		if IsSealedBackup(b) != (sealer != nil) || (sealer != nil && bytes.Contains(b, []byte("acct-1"))) {
			t.Errorf("sealed=%v backup: %.60q", sealer != nil, b)
		}
		got, err := DecodeBackup(b, sealer)
		if err != nil {
			t.Fatalf("DecodeBackup: %v", err)
		}
		if got.Policies[key].RatePerMinute != 600 || got.Logins[key].Key != key || got.Logins[key].Generation != 3 ||
			got.AgentCreds["team-a"].Name != "team-a" || got.Removed["login:acct_00000000000000b2"] != 4 {
			t.Errorf("round trip = %+v", got)
		}
	}
	tests := []struct {
		name, data, want string
		sealer           Sealer
	}{
		{"NotJSON", "hello", "not a clodex backup file", nil},
		{"Truncated", `{"format":1,"created":"2026-`, "not a clodex backup file", nil},
		{"UnknownField", `{"format":1,"bogus":1}`, "unknown field", nil},
		{"Format", `{"format":9}`, "format 9 is not supported", nil},
		{"SealedWithoutKey", sealedMagic + "xx", "this control plane has none", nil},
		{"SealedOtherKey", sealedMagic + "xx", "does not open", xorSealer{}},
		{"BadPolicy", `{"format":1,"policies":{"acct_0123456789abcdef":{"version":0,"rate_per_minute":601,"burst":1}}}`, "policy of acct_0123456789abcdef", nil},
	}
	for _, tt := range tests {
		if _, err := DecodeBackup([]byte(tt.data), tt.sealer); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: DecodeBackup = %v; want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// A backup dir keeps the newest files (mode 0600), writes nothing for an
// unchanged state, and Newest skips a file that does not open.
func TestBackupDir(t *testing.T) {
	dir := t.TempDir()
	b, err := OpenBackupDir(BackupOptions{Dir: filepath.Join(dir, "backups"), Replica: "cp/1", Sealer: xorSealer{}, Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	s := sampleSnapshot()
	var paths []string
	for i := range 5 {
		s.Version = int64(10 + i)
		s.Created = s.Created.Add(time.Second)
		p, err := b.Write(s)
		if err != nil || p == "" {
			t.Fatalf("Write %d: %q, %v", i, p, err)
		}
		paths = append(paths, p)
		if p, err := b.Write(s); err != nil || p != "" {
			t.Errorf("Write of an unchanged state = %q, %v; want nothing written", p, err)
		}
	}
	files, _ := b.files()
	if len(files) != 3 || filepath.Join(b.Dir(), files[0]) != paths[4] || !strings.Contains(files[0], "-cp_1.cbk") {
		t.Errorf("files = %v; want the newest 3, newest first (%s)", files, paths[4])
	}
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(b.Dir(), f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, fi.Mode().Perm())
		}
	}
	if err := os.WriteFile(paths[4], []byte(sealedMagic+"damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, p, skipped, err := b.Newest()
	if err != nil || p != paths[3] || got.Version != 13 || len(skipped) != 1 || !strings.Contains(skipped[0], filepath.Base(paths[4])) {
		t.Errorf("Newest = version %d from %q, skipped %v, %v; want the one before the damaged newest", got.Version, p, skipped, err)
	}
	empty, _ := OpenBackupDir(BackupOptions{Dir: filepath.Join(dir, "empty")})
	if _, _, _, err := empty.Newest(); !errors.Is(err, ErrNoBackup) {
		t.Errorf("Newest of an empty dir = %v; want ErrNoBackup", err)
	}
}

// A policy.json that does not decode (truncated) is reported and its last
// good copy takes its place; the damaged file is kept aside.
func TestPolicyFileRecoveredFromLastGoodCopy(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	setPolicy(t, m, key, 600)
	path := filepath.Join(dir, PolicyFile)
	good, _ := os.ReadFile(path)
	if err := os.WriteFile(path, good[:len(good)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	m2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open with a truncated policy.json: %v", err)
	}
	a, err := m2.Account(t.Context(), key, t0)
	if err != nil || a.Policy.RatePerMinute != 600 {
		t.Errorf("Account after the recovery = %+v, %v; want the last good rate 600", a, err)
	}
	i := m2.Info()
	if i.LostAt.IsZero() || !strings.Contains(i.Loss, PolicyFile) || !strings.Contains(i.Restored, ".bak") {
		t.Errorf("Info = %+v; want the loss and the last good copy named", i)
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
		t.Errorf("damaged file kept aside: %v; want one", m)
	}
	// Both damaged: an error naming the file.
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".bak", []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), PolicyFile) || !strings.Contains(err.Error(), "last good copy") {
		t.Errorf("Open with both damaged = %v; want an error naming both", err)
	}
}

// A data dir without policy.json and logins.json (emptied, or a new disk)
// is restored from the newest backup, saying so; a restore keeps newer
// records unless forced.
func TestDirStateBackupAndRestore(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	setPolicy(t, m, key, 600)
	l, err := OpenLogins(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.PutLogin(t.Context(), Login{Key: key, AccountID: "acct-1", Sealed: []byte("s1")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.PutAgentCred(t.Context(), AgentCred{Name: "team-a", Digest: bytes.Repeat([]byte{1}, 32), Accounts: []string{key}}); err != nil {
		t.Fatal(err)
	}
	ds := DirState{Policies: m, Logins: l}
	snap, err := ds.Snapshot(t.Context())
	if err != nil || len(snap.Policies) != 1 || len(snap.Logins) != 1 || len(snap.AgentCreds) != 1 {
		t.Fatalf("Snapshot = %+v, %v", snap, err)
	}
	bd, err := OpenBackupDir(BackupOptions{Dir: filepath.Join(dir, "..", "backups")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bd.Write(snap); err != nil {
		t.Fatal(err)
	}

	empty := t.TempDir()
	m2, err := Open(Options{Dir: empty, Backup: bd.Newest})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := m2.Account(t.Context(), key, t0); err != nil || a.Policy.RatePerMinute != 600 {
		t.Errorf("Account in an empty data dir with a backup = %+v, %v; want rate 600", a, err)
	}
	if !strings.Contains(m2.Info().Restored, "backup") {
		t.Errorf("Info().Restored = %q; want it to name the backup", m2.Info().Restored)
	}
	l2, err := OpenLoginFile(LoginOptions{Dir: empty, Backup: bd.Newest})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := l2.Login(t.Context(), key); err != nil || string(got.Sealed) != "s1" {
		t.Errorf("Login restored from the backup = %+v, %v", got, err)
	}

	// A newer change survives a restore of the older backup; force
	// writes the backup's as a new change.
	setPolicy(t, m2, key, 300)
	ds2 := DirState{Policies: m2, Logins: l2}
	res, err := ds2.Restore(t.Context(), snap, RestoreOptions{})
	if err != nil || res.Policies.Kept != 1 || res.Logins.Kept != 1 || res.AgentCreds.Kept != 1 {
		t.Errorf("Restore = %+v, %v; want every record kept (the data dir's are as new or newer)", res, err)
	}
	if a, _ := m2.Account(t.Context(), key, t0); a.Policy.RatePerMinute != 300 {
		t.Errorf("rate after a restore of an older backup = %d; want 300 kept", a.Policy.RatePerMinute)
	}
	res, err = ds2.Restore(t.Context(), snap, RestoreOptions{Force: true})
	if err != nil || res.Policies.Restored != 1 {
		t.Errorf("forced Restore = %+v, %v", res, err)
	}
	a, _ := m2.Account(t.Context(), key, t0)
	if a.Policy.RatePerMinute != 600 || a.PolicyVersion <= 2 {
		t.Errorf("after a forced restore = %+v; want rate 600 as a new version", a)
	}
}

func setPolicy(t *testing.T, m *Memory, key string, rate int) Account {
	t.Helper()
	a, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = rate
		return p, nil
	})
	if err != nil {
		t.Fatalf("UpdatePolicy(%s, %d): %v", key, rate, err)
	}
	return a
}

// A logins.json truncated while the control plane runs is reported at the
// next read and its last good copy takes its place.
func TestLoginsFileRecoveredFromLastGoodCopy(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenLogins(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.PutLogin(t.Context(), Login{Key: key, AccountID: "acct-1", Sealed: []byte("s1")}, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, LoginsFile)
	if err := os.Truncate(path, 10); err != nil {
		t.Fatal(err)
	}
	got, err := l.Login(t.Context(), key)
	if err != nil || string(got.Sealed) != "s1" {
		t.Errorf("Login with logins.json truncated = %+v, %v; want the last good copy", got, err)
	}
	if at, loss, restored := l.Recovered(); at.IsZero() || !strings.Contains(loss, LoginsFile) || !strings.Contains(restored, ".bak") {
		t.Errorf("Recovered() = %v, %q, %q; want the recovery named", at, loss, restored)
	}
	if _, err := l.PutLogin(t.Context(), Login{Key: key, AccountID: "acct-1", Sealed: []byte("s2"), Generation: 1}, nil); err != nil {
		t.Errorf("PutLogin after the recovery: %v", err)
	}
}
