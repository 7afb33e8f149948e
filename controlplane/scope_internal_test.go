package controlplane

import (
	"crypto/sha256"
	"fmt"
	"testing"
)

// A reload remembers the credentials it dropped, by digest, so their
// refusals can name them: at most maxRevoked, the oldest forgotten first,
// and a credential created again is no longer revoked.
func TestScopeSetRemembersRevoked(t *testing.T) {
	var s scopeSet
	digest := func(i int) [sha256.Size]byte { return sha256.Sum256(fmt.Appendf(nil, "token-%d", i)) }
	set := func(ids ...int) {
		m := map[[sha256.Size]byte]*scopedCred{}
		for _, i := range ids {
			m[digest(i)] = &scopedCred{name: fmt.Sprintf("cred-%d", i), digest: digest(i)}
		}
		s.replace(m)
	}
	set(1, 2)
	set(2)
	if name, ok := s.revokedName(digest(1)); !ok || name != "cred-1" {
		t.Errorf("revokedName(1) = %q, %v; want cred-1", name, ok)
	}
	if _, ok := s.revokedName(digest(2)); ok {
		t.Error("revokedName(2) found a credential still in place")
	}
	set(1, 2)
	if _, ok := s.revokedName(digest(1)); ok {
		t.Error("a credential created again is still revoked")
	}
	all := make([]int, maxRevoked+10)
	for i := range all {
		all[i] = 100 + i
	}
	set(all...)
	set() // every one dropped at once
	set()
	if n := len(s.revoked); n != maxRevoked || len(s.order) != maxRevoked {
		t.Errorf("remembered %d revoked (%d in order), want %d", n, len(s.order), maxRevoked)
	}
}
