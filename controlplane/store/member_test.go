package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func member(name string, rate int) Member {
	return Member{Name: name, Digest: bytes.Repeat([]byte{byte(len(name))}, 32), Accounts: []string{key}, Pin: key, RatePerMinute: rate, Created: t0}
}

// Members live in logins.json beside the sign-ins: they come back from
// its last good copy when the file is damaged, from the newest backup when
// it is gone, and a restore keeps a member the data dir holds unless
// forced. A removed member is gone; removing it again is ErrNotFound.
func TestMembersInTheDataDir(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenLogins(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, m := range []Member{member("bob", 0), member("alice", 3)} {
		if err := l.PutMember(ctx, m); err != nil {
			t.Fatalf("PutMember(%s): %v", m.Name, err)
		}
	}
	if err := l.PutMember(ctx, Member{Name: "carol", Digest: []byte("short")}); err == nil || !strings.Contains(err.Error(), "the key digest is 5 bytes") {
		t.Errorf("PutMember without a digest = %v; want it refused naming the digest", err)
	}
	ms, err := l.Members(ctx)
	if err != nil || len(ms) != 2 || ms[0].Name != "alice" || ms[0].RatePerMinute != 3 || ms[0].Pin != key || ms[1].Name != "bob" {
		t.Fatalf("Members = %+v, %v; want alice (3, pinned) and bob, by name", ms, err)
	}

	// Truncated while running: the last good copy holds both.
	if err := os.Truncate(filepath.Join(dir, LoginsFile), 10); err != nil {
		t.Fatal(err)
	}
	if ms, err := l.Members(ctx); err != nil || len(ms) != 2 {
		t.Errorf("Members with logins.json truncated = %+v, %v; want both from the last good copy", ms, err)
	}

	// A backup holds them, and an emptied data dir is restored from it.
	ds := DirState{Policies: open(t, dir), Logins: l}
	snap, err := ds.Snapshot(ctx)
	if err != nil || len(snap.Members) != 2 || snap.Members["alice"].Name != "alice" {
		t.Fatalf("Snapshot members = %+v, %v", snap.Members, err)
	}
	b, err := EncodeBackup(snap, xorSealer{})
	if err != nil {
		t.Fatal(err)
	}
	if back, err := DecodeBackup(b, xorSealer{}); err != nil || back.Members["alice"].RatePerMinute != 3 {
		t.Errorf("backup round trip: members %+v, %v", back.Members, err)
	}
	bd, err := OpenBackupDir(BackupOptions{Dir: filepath.Join(t.TempDir(), "backups")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bd.Write(snap); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	l2, err := OpenLoginFile(LoginOptions{Dir: empty, Backup: bd.Newest})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := l2.Members(ctx); err != nil || len(ms) != 2 {
		t.Errorf("Members of an empty data dir restored from the backup = %+v, %v; want both", ms, err)
	}

	if err := l.RemoveMember(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveMember(ctx, "bob"); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveMember of a removed member = %v; want ErrNotFound", err)
	}
	changed := member("alice", 10)
	if err := l.PutMember(ctx, changed); err != nil {
		t.Fatal(err)
	}
	res, err := ds.Restore(ctx, snap, RestoreOptions{})
	if err != nil || res.Members.Kept != 1 || res.Members.Restored != 1 {
		t.Errorf("Restore = %+v, %v; want alice kept (the data dir holds her) and bob restored", res.Members, err)
	}
	ms, _ = l.Members(ctx)
	if len(ms) != 2 || ms[0].RatePerMinute != 10 {
		t.Errorf("Members after the restore = %+v; want alice at 10 kept and bob back", ms)
	}
	if res, err := ds.Restore(ctx, snap, RestoreOptions{Force: true}); err != nil || res.Members.Restored != 2 {
		t.Errorf("forced Restore = %+v, %v", res.Members, err)
	}
}

// A backup whose member does not validate is refused, naming it.
func TestBackupWithBadMember(t *testing.T) {
	s := sampleSnapshot()
	s.Members = map[string]Member{"alice": {Digest: []byte("x"), RatePerMinute: 601}}
	b, err := EncodeBackup(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = DecodeBackup(b, nil)
	if err == nil || !strings.Contains(err.Error(), `member "alice"`) || !strings.Contains(err.Error(), "rate_per_minute 601") {
		t.Errorf("DecodeBackup with a bad member = %v; want it refused naming the member and the rate", err)
	}
}
