package redisstore

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clodex/clodex/controlplane/store"
)

// ledger is this replica's copy of the durable records it last read or
// wrote besides the policies (which policyCache holds): the broker's
// sign-ins, the scoped agent credentials, the members, the removals it
// saw, and the refresh leases it holds. When the store loses data the replica writes
// it back (heal.go); backups are made from it. Each record keeps its
// version, so a write-back never replaces a newer one.
type ledger struct {
	changes atomic.Uint64 // counts changes, for backups
	changed chan struct{} // size 1: wakes the backup writer without blocking a change

	mu      sync.Mutex // guards the following fields
	logins  map[string]store.Login
	creds   map[string]store.AgentCred
	members map[string]store.Member
	removed map[string]int64 // "login:KEY", "cred:NAME" or "member:NAME" -> the removed version
	leases  map[string]heldLease
	fences  map[string]int64 // the highest fencing token this replica took, per account
	canary  []byte           // the credential key's sealed canary (broker.CheckKey)
}

// heldLease is a refresh lease this replica holds.
type heldLease struct {
	fence int64
	until time.Time // local monotonic clock
}

func newLedger() *ledger {
	return &ledger{
		changed: make(chan struct{}, 1),
		logins:  map[string]store.Login{},
		creds:   map[string]store.AgentCred{},
		members: map[string]store.Member{},
		removed: map[string]int64{},
		leases:  map[string]heldLease{},
		fences:  map[string]int64{},
	}
}

// note records a change of the durable state.
func (l *ledger) note() {
	l.changes.Add(1)
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// login returns the copy of key's login.
func (l *ledger) login(key string) (store.Login, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.logins[key]
	return c, ok
}

// putLogin keeps c unless the ledger holds a newer generation.
func (l *ledger) putLogin(c store.Login) {
	l.mu.Lock()
	cur, ok := l.logins[c.Key]
	keep := !ok || cur.Generation < c.Generation || (cur.Generation == c.Generation && !sameLogin(cur, c))
	if keep {
		c.Unreadable = ""
		l.logins[c.Key] = c
	}
	l.mu.Unlock()
	if keep {
		l.note()
	}
}

func sameLogin(a, b store.Login) bool {
	return a.AccountID == b.AccountID && string(a.Sealed) == string(b.Sealed) && a.Expiry.Equal(b.Expiry) &&
		a.NeedsLogin == b.NeedsLogin && a.Refreshes == b.Refreshes && a.Refreshed.Equal(b.Refreshed)
}

// dropLogin forgets key's login, removed at generation gen.
func (l *ledger) dropLogin(key string, gen int64) {
	l.mu.Lock()
	delete(l.logins, key)
	f := "login:" + key
	l.removed[f] = max(l.removed[f], gen)
	l.mu.Unlock()
	l.note()
}

// putCred keeps c unless the ledger holds a newer version.
func (l *ledger) putCred(c store.AgentCred) {
	c.Unreadable = ""
	putNewer(l, l.creds, c.Name, c, c.Version, func(c store.AgentCred) int64 { return c.Version })
}

// dropCred forgets credential name, removed at version v.
func (l *ledger) dropCred(name string, v int64) { dropRemoved(l, l.creds, name, "cred:", v) }

// putMember keeps m unless the ledger holds a newer version.
func (l *ledger) putMember(m store.Member) {
	m.Unreadable = ""
	putNewer(l, l.members, m.Name, m, m.Version, func(m store.Member) int64 { return m.Version })
}

// dropMember forgets member name, removed at version v.
func (l *ledger) dropMember(name string, v int64) { dropRemoved(l, l.members, name, "member:", v) }

// putNewer keeps r, of version v, as m's record name unless m holds a
// newer one. m is one of the ledger's maps (made once, guarded by l.mu).
func putNewer[R any](l *ledger, m map[string]R, name string, r R, v int64, version func(R) int64) {
	l.mu.Lock()
	cur, ok := m[name]
	keep := !ok || version(cur) < v
	if keep {
		m[name] = r
	}
	l.mu.Unlock()
	if keep {
		l.note()
	}
}

// dropRemoved forgets m's record name, removed at version v (its removal
// recorded under prefix+name).
func dropRemoved[R any](l *ledger, m map[string]R, name, prefix string, v int64) {
	l.mu.Lock()
	delete(m, name)
	f := prefix + name
	l.removed[f] = max(l.removed[f], v)
	l.mu.Unlock()
	l.note()
}

// membersCopy returns a copy of the members the ledger holds.
func (l *ledger) membersCopy() map[string]store.Member {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.members)
}

// noteRemoved records removals another replica made (the store's
// removals hash), forgetting the records they removed.
func (l *ledger) noteRemoved(removed map[string]int64) {
	changed := false
	l.mu.Lock()
	for f, v := range removed {
		if l.removed[f] >= v {
			continue
		}
		l.removed[f], changed = v, true
		switch {
		case len(f) > 6 && f[:6] == "login:":
			if c, ok := l.logins[f[6:]]; ok && c.Generation <= v {
				delete(l.logins, f[6:])
			}
		case len(f) > 5 && f[:5] == "cred:":
			if c, ok := l.creds[f[5:]]; ok && c.Version <= v {
				delete(l.creds, f[5:])
			}
		case len(f) > 7 && f[:7] == "member:":
			if m, ok := l.members[f[7:]]; ok && m.Version <= v {
				delete(l.members, f[7:])
			}
		}
	}
	l.mu.Unlock()
	if changed {
		l.note()
	}
}

// took records a lease this replica took.
func (l *ledger) took(key string, fence int64, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leases[key] = heldLease{fence: fence, until: until}
	l.fences[key] = max(l.fences[key], fence)
}

// released forgets a lease this replica gave up.
func (l *ledger) released(key string, fence int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.leases[key]; ok && h.fence == fence {
		delete(l.leases, key)
	}
}

// fence returns the highest fencing token this replica took for key.
func (l *ledger) fence(key string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fences[key]
}

// setCanary keeps the key canary.
func (l *ledger) setCanary(c []byte) {
	l.mu.Lock()
	changed := string(l.canary) != string(c)
	l.canary = c
	l.mu.Unlock()
	if changed {
		l.note()
	}
}

// keyCanary returns the key canary this replica holds (nil: none).
func (l *ledger) keyCanary() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.canary
}

// copyOf returns copies of the ledger's records.
func (l *ledger) copyOf() (logins map[string]store.Login, creds map[string]store.AgentCred, removed map[string]int64, leases map[string]heldLease, fences map[string]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.logins), maps.Clone(l.creds), maps.Clone(l.removed), maps.Clone(l.leases), maps.Clone(l.fences)
}
