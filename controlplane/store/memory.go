package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// ErrNotFound reports an account key with neither admissions nor a stored
// policy.
var ErrNotFound = errors.New("account not found")

// shardCount is the number of independently locked shards; a power of two.
const shardCount = 64

// maxPending bounds the pending reservations remembered per account. The
// bucket's debt floor already bounds them (at most bound × rate, 150 at the
// maxima), so this only guards against a future policy range change.
const maxPending = 1024

// Admission is the outcome of one Admit.
type Admission struct {
	Decision pacing.Decision
	// PolicyVersion is the version of the policy the decision was made
	// under; 0 for the default policy.
	PolicyVersion int64
	// Reservation identifies a debited admission whose wait is still
	// pending (Decision.Wait > 0); 0 when there is nothing to cancel.
	Reservation uint64
}

// Account is a snapshot of one account.
type Account struct {
	Key           string
	Policy        pacing.Policy
	Tokens        float64 // at the snapshot's instant; negative is debt
	PolicyVersion int64   // 0 for the default policy
	Custom        bool    // the account has a stored policy
	// EffectiveRate is the rate the bucket paces at: Policy.RatePerMinute
	// (the configured rate) unless adaptive mode has lowered it.
	EffectiveRate int
	Adaptive      bool // adaptive mode is on
	// PausedUntil is when the pause after an upstream 403 ends (adaptive
	// mode); zero when admissions are not paused.
	PausedUntil time.Time
	// Unreadable, when set, says the account's stored policy does not
	// decode (which record, and why); Policy is then the last good copy
	// the store holds, or the default one (Custom false).
	Unreadable string
}

// Options configures Open. The zero value is a memory-only store with
// pacing.DefaultPolicy for new accounts.
type Options struct {
	// Dir is the data directory holding policy.json. (Optional; default
	// "": policies are kept in memory only.)
	Dir string
	// Defaults is the policy for accounts without a stored policy.
	// (Optional; default pacing.DefaultPolicy().)
	Defaults *pacing.Policy
	// Now is the clock for buckets created while loading and for Run's
	// sweeps. (Optional; default time.Now.)
	Now func() time.Time
	// SweepEvery is how often Run sweeps. (Optional; default 1m)
	SweepEvery time.Duration
	// SweepIdle is how long an account must be idle before a sweep may
	// forget it. (Optional; default 10m)
	SweepIdle time.Duration
	// Logger receives the store's notices: a policy file recovered from
	// its last good copy or restored from a backup. (Optional; default
	// discards)
	Logger *slog.Logger
	// Backup returns the newest backup (a BackupDir's Newest): a data dir
	// whose policy.json is missing (a new or emptied dir) or unreadable
	// with no good copy is restored from it, saying so. (Optional)
	Backup func() (snap Snapshot, path string, skipped []string, err error)
	// ColdStart is how long after Open new buckets start empty instead of
	// full: an explicit blanket stand-in for the grants the fleet made
	// while this control plane was down. Data planes hand those grants
	// over instead (HandOver), so a fresh store needs none. (Optional;
	// default 0: buckets start full.)
	ColdStart time.Duration
}

// Memory is the in-memory store. It is safe for concurrent use.
type Memory struct {
	defaults   pacing.Policy
	file       string // "" when not persisted
	dir        string // the data directory holding file
	now        func() time.Time
	sweepEvery time.Duration
	sweepIdle  time.Duration
	coldUntil  time.Time // buckets created before this start empty

	shards [shardCount]shard

	mu       sync.Mutex // guards the following fields; held across a policy write
	version  int64
	policies map[string]storedPolicy

	handovers reports
	agents    agentDir
	quotas    quotas
	members   memberBuckets // each member's cap (memberbuckets.go)
	usage     usageLedger   // usage.go
	log       *slog.Logger

	// recovered says how Open found policy.json when it was not as last
	// written (for Info); zero otherwise.
	recovered recovery
}

// recovery is what a store found at open and put back.
type recovery struct {
	at       time.Time
	loss     string
	restored string
}

type shard struct {
	mu       sync.Mutex // guards accounts and every *entry in it
	accounts map[string]*entry
	_        [40]byte // keep neighbouring shards' locks off one cache line
}

type entry struct {
	bucket  *pacing.Bucket // paces at bucketPolicy()
	policy  pacing.Policy  // the configured policy
	adapt   adaptive
	version int64
	custom  bool
	pending []pending // debited reservations still waiting, oldest first
}

type pending struct {
	id     uint64
	depart time.Time
}

// Open returns a store, loading stored policies from opts.Dir when set.
// A missing policy file is an empty one; a malformed one is an error that
// names the problem.
func Open(opts Options) (*Memory, error) {
	m := &Memory{
		defaults:   pacing.DefaultPolicy(),
		policies:   map[string]storedPolicy{},
		now:        time.Now,
		sweepEvery: time.Minute,
		sweepIdle:  10 * time.Minute,
	}
	if opts.Defaults != nil {
		m.defaults = *opts.Defaults
	}
	if opts.Now != nil {
		m.now = opts.Now
	}
	if opts.SweepEvery > 0 {
		m.sweepEvery = opts.SweepEvery
	}
	if opts.SweepIdle > 0 {
		m.sweepIdle = opts.SweepIdle
	}
	for i := range m.shards {
		m.shards[i].accounts = map[string]*entry{}
	}
	if opts.ColdStart > 0 {
		m.coldUntil = m.now().Add(opts.ColdStart)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m.log = log
	if opts.Dir == "" {
		return m, nil
	}
	if err := CheckDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	now := m.now
	m.dir, m.file = opts.Dir, policyPath(opts.Dir)
	f, rec, err := loadPolicyFile(m.file)
	switch {
	case rec != nil:
		m.recovered = recovery{at: rec.At, loss: rec.File + ": " + rec.Err.Error(), restored: "from its last good copy " + rec.From}
		log.Error("the policy file was not as last written; its last good copy took its place", "file", m.file, "recovery", rec.String())
	case err != nil || (len(f.Accounts) == 0 && opts.Backup != nil):
		// Unreadable with no good copy, or missing: the newest backup.
		snap, path, skipped, berr := newestOf(opts.Backup)
		for _, sk := range skipped {
			log.Error("a backup does not open; skipped", "backup", sk)
		}
		if berr != nil {
			if err != nil {
				return nil, fmt.Errorf("open store: %w", err)
			}
			break // a new data dir and no backup: a new store
		}
		f = policyFile{Format: fileFormat, Version: snap.Version, Accounts: map[string]storedPolicy{}}
		for k, p := range snap.Policies {
			f.Accounts[k] = storedPolicy(p)
			f.Version = max(f.Version, p.Version)
		}
		if werr := writePolicyFile(m.file, f); werr != nil {
			return nil, fmt.Errorf("open store: restore %s from backup %s: %w", m.file, path, &WriteError{Dir: m.dir, Err: werr})
		}
		why := "missing"
		if err != nil {
			why = "unreadable (" + err.Error() + ")"
		}
		m.recovered = recovery{at: time.Now(), loss: m.file + " was " + why,
			restored: fmt.Sprintf("%d policies from backup %s written %s", len(f.Accounts), path, snap.Created.UTC().Format(time.RFC3339))}
		log.Warn("the policy file was "+why+": restored the policies from the newest backup", "file", m.file, "backup", path,
			"written", snap.Created.UTC(), "policies", len(f.Accounts))
	}
	m.version = f.Version
	t := now()
	for key, sp := range f.Accounts {
		p := sp.policy()
		m.policies[key] = sp
		sh := m.shard(key)
		e := &entry{policy: p, version: sp.Version, custom: true}
		e.adapt.reset(sp.Adaptive, p.RatePerMinute, t)
		e.bucket = m.newBucket(e.bucketPolicy(), t)
		sh.accounts[key] = e
	}
	if m.usage.journal, err = openUsageJournal(m.dir, log, t, &m.usage); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return m, nil
}

// newestOf calls backup, or reports ErrNoBackup when it is nil.
func newestOf(backup func() (Snapshot, string, []string, error)) (Snapshot, string, []string, error) {
	if backup == nil {
		return Snapshot{}, "", nil, ErrNoBackup
	}
	return backup()
}

// Defaults returns the policy for accounts without a stored policy.
func (m *Memory) Defaults() pacing.Policy { return m.defaults }

// Info describes the store: kind "memory", the policy file as its
// address, and what Open found and put back.
func (m *Memory) Info() Info {
	i := Info{Kind: "memory", Address: m.file, Replicas: 1}
	if r := m.recovered; !r.at.IsZero() {
		i.LostAt, i.Loss, i.RestoredAt, i.Restored = r.at, r.loss, r.at, r.restored
	}
	return i
}

// HandOver debits grants made elsewhere (see HandOverResult). A reportID
// already applied to key within HandOverIdempotency is a duplicate.
func (m *Memory) HandOver(_ context.Context, key string, grants int, reportID string, now time.Time) (HandOverResult, error) {
	if !m.handovers.first(reportID+"\x00"+key, now) {
		return HandOverResult{Duplicate: true}, nil
	}
	grants = min(max(grants, 0), MaxHandOverGrants)
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := m.entryLocked(sh, key, now)
	e.prunePendingLocked(now)
	e.advanceLocked(now)
	n := 0
	for n < grants && e.bucket.Take(now).Debited {
		n++
	}
	return HandOverResult{Debited: n, Account: e.snapshotLocked(key, now)}, nil
}

// reports remembers hand-over report ids for HandOverIdempotency.
type reports struct {
	mu    sync.Mutex // guards the following fields
	seen  map[string]time.Time
	order []string // insertion order, for expiry
}

// first records id at now and reports whether it was not already recorded
// (within HandOverIdempotency).
func (r *reports) first(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]time.Time{}
	}
	n := 0
	for n < len(r.order) && now.Sub(r.seen[r.order[n]]) >= HandOverIdempotency {
		delete(r.seen, r.order[n])
		n++
	}
	r.order = slices.Delete(r.order, 0, n)
	if at, ok := r.seen[id]; ok && now.Sub(at) < HandOverIdempotency {
		return false
	}
	r.seen[id] = now
	r.order = append(r.order, id)
	return true
}

// shard returns key's shard (FNV-1a, inlined so it does not allocate).
func (m *Memory) shard(key string) *shard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &m.shards[h%shardCount]
}

// newBucket returns a bucket for p at now: full, or empty during the cold
// start after Open (see Options.ColdStart).
func (m *Memory) newBucket(p pacing.Policy, now time.Time) *pacing.Bucket {
	if now.Before(m.coldUntil) {
		return pacing.Restore(p, pacing.State{Tokens: 0, Updated: now})
	}
	return pacing.NewBucket(p, now)
}

// entryLocked returns key's entry, creating it with the default policy.
func (m *Memory) entryLocked(sh *shard, key string, now time.Time) *entry {
	e := sh.accounts[key]
	if e == nil {
		e = &entry{policy: m.defaults}
		e.adapt.reset(DefaultAdaptive, m.defaults.RatePerMinute, now)
		e.bucket = m.newBucket(e.bucketPolicy(), now)
		sh.accounts[key] = e
	}
	return e
}

// Admit runs key's bucket once at now, creating the bucket with the default
// policy on first use. It never fails; the error is for stores that can.
func (m *Memory) Admit(_ context.Context, key string, now time.Time) (Admission, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	e := m.entryLocked(sh, key, now)
	e.prunePendingLocked(now)
	e.advanceLocked(now)
	var d pacing.Decision
	if until, ok := e.adapt.paused(now); ok {
		d = pauseDecision(e.bucketPolicy(), now, until, func() pacing.Decision { return e.bucket.Take(now) })
	} else {
		d = e.bucket.Take(now)
	}
	a := Admission{Decision: d, PolicyVersion: e.version}
	if d.Debited && d.Wait > 0 {
		if len(e.pending) >= maxPending {
			e.pending = slices.Delete(e.pending, 0, 1)
		}
		e.pending = append(e.pending, pending{id: d.ID, depart: now.Add(d.Wait)})
		a.Reservation = d.ID
	}
	sh.mu.Unlock()
	return a, nil
}

// prunePendingLocked forgets reservations that have departed by now.
// Departures are nearly always in order; one out of order is dropped on a
// later call (Cancel checks the departure itself).
func (e *entry) prunePendingLocked(now time.Time) {
	n := 0
	for n < len(e.pending) && !e.pending[n].depart.After(now) {
		n++
	}
	if n > 0 {
		e.pending = slices.Delete(e.pending, 0, n)
	}
}

// Cancel refunds reservation id of key if it is still pending at now, and
// reports whether it did. Each reservation is refunded at most once.
func (m *Memory) Cancel(_ context.Context, key string, id uint64, now time.Time) (bool, error) {
	if id == 0 {
		return false, nil
	}
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.accounts[key]
	if e == nil {
		return false, nil
	}
	e.prunePendingLocked(now)
	i := slices.IndexFunc(e.pending, func(p pending) bool { return p.id == id })
	if i < 0 || !e.pending[i].depart.After(now) {
		return false, nil
	}
	e.pending = slices.Delete(e.pending, i, i+1)
	return e.bucket.RefundReservation(now, id), nil
}

// UpdatePolicy changes key's policy: update receives the current policy
// (the default one for an account without a stored policy) and returns the
// new one, or an error that UpdatePolicy returns unchanged. The new policy
// is persisted before it takes effect; a failed write changes nothing. In
// adaptive mode a new configured rate restarts the effective rate at it.
func (m *Memory) UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (Account, error) {
	return m.updateStored(ctx, key, now, func(sp storedPolicy) (storedPolicy, error) {
		p, err := update(sp.policy())
		if err != nil {
			return sp, err
		}
		adaptive := sp.Adaptive
		sp = newStoredPolicy(p, sp.Version)
		sp.Adaptive = adaptive
		return sp, nil
	})
}

// updateStored changes key's stored policy under a new store-wide version,
// persists it, then applies it to the bucket.
func (m *Memory) updateStored(_ context.Context, key string, now time.Time, update func(storedPolicy) (storedPolicy, error)) (Account, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, had := m.policies[key]
	if !had {
		cur = newStoredPolicy(m.defaults, 0)
	}
	next, err := update(cur)
	if err != nil {
		return Account{}, err
	}
	version := m.version + 1
	next.Version = version
	m.policies[key] = next
	if m.file != "" {
		if err := writePolicyFile(m.file, policyFile{Version: version, Accounts: m.policies}); err != nil {
			if had {
				m.policies[key] = cur
			} else {
				delete(m.policies, key)
			}
			return Account{}, fmt.Errorf("update policy: %w", &WriteError{Dir: m.dir, Err: err})
		}
	}
	m.version = version

	p := next.policy()
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.accounts[key]
	if e == nil {
		e = &entry{}
		sh.accounts[key] = e
	}
	// A new configured rate or mode starts adaptive mode over; a budget
	// change keeps its effective rate.
	if e.bucket == nil || e.policy.RatePerMinute != p.RatePerMinute || e.adapt.on != next.Adaptive {
		e.adapt.reset(next.Adaptive, p.RatePerMinute, now)
	}
	e.policy = p
	if e.bucket == nil {
		e.bucket = m.newBucket(e.bucketPolicy(), now)
	} else {
		e.bucket.SetPolicy(now, e.bucketPolicy())
	}
	e.version = version
	e.custom = true
	return e.snapshotLocked(key, now), nil
}

func (e *entry) snapshotLocked(key string, now time.Time) Account {
	a := Account{
		Key:           key,
		Policy:        e.policy,
		Tokens:        e.bucket.Tokens(now),
		PolicyVersion: e.version,
		Custom:        e.custom,
		EffectiveRate: e.bucket.Policy().RatePerMinute,
		Adaptive:      e.adapt.on,
	}
	if until, ok := e.adapt.paused(now); ok {
		a.PausedUntil = until
	}
	return a
}

// Account returns key's snapshot at now, or ErrNotFound.
func (m *Memory) Account(_ context.Context, key string, now time.Time) (Account, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.accounts[key]
	if e == nil {
		return Account{}, ErrNotFound
	}
	e.advanceLocked(now)
	return e.snapshotLocked(key, now), nil
}

// Accounts returns every known account at now, ordered by key.
func (m *Memory) Accounts(_ context.Context, now time.Time) ([]Account, error) {
	var out []Account
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for key, e := range sh.accounts {
			e.advanceLocked(now)
			out = append(out, e.snapshotLocked(key, now))
		}
		sh.mu.Unlock()
	}
	sortAccounts(out)
	return out, nil
}

func sortAccounts(accts []Account) {
	slices.SortFunc(accts, func(a, b Account) int { return cmp.Compare(a.Key, b.Key) })
}

// Len returns the number of known accounts.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.accounts)
		sh.mu.Unlock()
	}
	return n
}

// Version returns the store-wide policy version (0 before any change).
func (m *Memory) Version() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

// Sweep forgets accounts that are indistinguishable from new ones and have
// been idle for at least idle at now: no stored policy, no pending
// reservation, a full bucket and no admission since now-idle. It returns
// how many it forgot. It keeps memory bounded by the accounts in use; a
// forgotten account is recreated with the default policy on its next
// Admit, exactly as it would have continued.
func (m *Memory) Sweep(now time.Time, idle time.Duration) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for key, e := range sh.accounts {
			e.prunePendingLocked(now)
			if e.custom || len(e.pending) > 0 || now.Sub(e.bucket.State().Updated) < idle {
				continue
			}
			if e.bucket.Tokens(now) < float64(e.bucket.Policy().Burst) {
				continue
			}
			delete(sh.accounts, key)
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// Run sweeps idle accounts, and the usage ledger's expired minutes and
// files, every Options.SweepEvery until ctx ends, and returns nil then.
// Without Run the store keeps every account it has seen.
func (m *Memory) Run(ctx context.Context) error {
	t := time.NewTicker(m.sweepEvery)
	defer t.Stop()
	m.sweepUsage(m.now(), m.log)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			now := m.now()
			m.Sweep(now, m.sweepIdle)
			m.members.sweep(now, m.sweepIdle)
			m.sweepUsage(now, m.log)
		}
	}
}
