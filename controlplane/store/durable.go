package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// DirState is the durable state of one control plane on its data dir:
// the policies of the memory store (policy.json) and the sign-ins, agent
// credentials and members of the logins file (logins.json). It takes snapshots
// and restores them, as the Redis store does for replicas.
type DirState struct {
	Policies *Memory
	// Logins may be nil (no broker and no agent credentials).
	Logins *LoginFile
	// Replica names the taker in snapshots. (Optional)
	Replica string
}

// Snapshot returns the data dir's durable state.
func (d DirState) Snapshot(ctx context.Context) (Snapshot, error) {
	s := Snapshot{Created: time.Now().UTC(), Kind: "memory", Replica: d.Replica}
	s.Version, s.Policies = d.Policies.policySnapshot()
	if d.Logins != nil {
		doc, err := d.Logins.read()
		if err != nil {
			return Snapshot{}, fmt.Errorf("snapshot: %w", err)
		}
		s.Logins, s.AgentCreds, s.Members = doc.Logins, doc.AgentCreds, doc.Members
		if s.KeyCanary, err = d.Logins.KeyCanary(ctx); err != nil {
			return Snapshot{}, fmt.Errorf("snapshot: %w", err)
		}
	}
	return s.normalized(), nil
}

// Changes counts the data dir's durable changes (for backups).
func (d DirState) Changes() uint64 {
	n := uint64(d.Policies.Version())
	if d.Logins != nil {
		n += d.Logins.writes.Load()
	}
	return n
}

// Restore puts a snapshot back: each record unless the data dir holds it
// in the same or a newer version; with opts.Force every record, each as a
// new change.
func (d DirState) Restore(ctx context.Context, s Snapshot, opts RestoreOptions) (RestoreResult, error) {
	var res RestoreResult
	var err error
	if res.Policies, err = d.Policies.restorePolicies(s, opts, time.Now()); err != nil {
		return res, err
	}
	if d.Logins == nil {
		if len(s.Logins) > 0 || len(s.AgentCreds) > 0 || len(s.Members) > 0 {
			return res, fmt.Errorf("restore: the backup holds %d sign-ins, %d agent credentials and %d members and this control plane keeps none",
				len(s.Logins), len(s.AgentCreds), len(s.Members))
		}
		return res, nil
	}
	if res.Logins, res.AgentCreds, err = d.Logins.restore(ctx, s, opts); err != nil {
		return res, err
	}
	if res.Members, err = d.Logins.restoreMembers(ctx, s, opts); err != nil {
		return res, err
	}
	if s.KeyCanary != nil {
		if err := d.Logins.PutKeyCanary(ctx, s.KeyCanary, false); err != nil {
			return res, err
		}
	}
	return res, nil
}

// policySnapshot returns the store-wide version and every stored policy.
func (m *Memory) policySnapshot() (int64, map[string]PolicyRecord) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]PolicyRecord, len(m.policies))
	for k, sp := range m.policies {
		out[k] = PolicyRecord(sp)
	}
	return m.version, out
}

// restorePolicies writes s's policies (see DirState.Restore) in one
// policy file write, then applies them to the buckets.
func (m *Memory) restorePolicies(s Snapshot, opts RestoreOptions, now time.Time) (RestoreCount, error) {
	var c RestoreCount
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.policies)
	version := max(m.version, s.Version)
	var changed []string
	for _, k := range slices.Sorted(maps.Keys(s.Policies)) {
		rec := storedPolicy(s.Policies[k])
		if cur, ok := next[k]; ok && cur.Version >= rec.Version && !opts.Force {
			c.Kept++
			continue
		}
		if opts.Force {
			version++
			rec.Version = version
		}
		version = max(version, rec.Version)
		next[k] = rec
		changed = append(changed, k)
		c.Restored++
	}
	if len(changed) == 0 {
		return c, nil
	}
	if m.file != "" {
		if err := writePolicyFile(m.file, policyFile{Version: version, Accounts: next}); err != nil {
			return RestoreCount{}, fmt.Errorf("restore policies: %w", &WriteError{Dir: m.dir, Err: err})
		}
	}
	m.policies, m.version = next, version
	for _, k := range changed {
		sp := next[k]
		p := sp.policy()
		sh := m.shard(k)
		sh.mu.Lock()
		e := sh.accounts[k]
		if e == nil {
			e = &entry{}
			sh.accounts[k] = e
		}
		e.adapt.reset(sp.Adaptive, p.RatePerMinute, now)
		e.policy, e.version, e.custom = p, sp.Version, true
		if e.bucket == nil {
			e.bucket = m.newBucket(e.bucketPolicy(), now)
		} else {
			e.bucket.SetPolicy(now, e.bucketPolicy())
		}
		sh.mu.Unlock()
	}
	return c, nil
}

// restore writes s's sign-ins and agent credentials (see
// DirState.Restore), each sign-in under its refresh lease so no refresh
// in flight loses its rotated tokens.
func (f *LoginFile) restore(ctx context.Context, s Snapshot, opts RestoreOptions) (logins, creds RestoreCount, err error) {
	for _, k := range slices.Sorted(maps.Keys(s.Logins)) {
		l := s.Logins[k]
		lease, err := f.AcquireLease(ctx, k, 0)
		if err != nil {
			return logins, creds, fmt.Errorf("restore the sign-in of %s: %w", k, err)
		}
		err = f.update(ctx, func(d *loginsDoc) error {
			cur, ok := d.Logins[k]
			if ok && cur.Generation >= l.Generation && !opts.Force {
				logins.Kept++
				return nil
			}
			if ok && opts.Force {
				l.Generation = max(l.Generation, cur.Generation+1)
			}
			d.Logins[k] = l
			logins.Restored++
			return nil
		})
		_ = lease.Release()
		if err != nil {
			return logins, creds, fmt.Errorf("restore the sign-in of %s: %w", k, err)
		}
	}
	err = f.update(ctx, func(d *loginsDoc) error {
		if d.AgentCreds == nil {
			d.AgentCreds = map[string]AgentCred{}
		}
		for _, n := range slices.Sorted(maps.Keys(s.AgentCreds)) {
			if _, ok := d.AgentCreds[n]; ok && !opts.Force {
				creds.Kept++
				continue
			}
			c := s.AgentCreds[n]
			c.Version = 0
			d.AgentCreds[n] = c
			creds.Restored++
		}
		return nil
	})
	if err != nil {
		return logins, creds, fmt.Errorf("restore agent credentials: %w", err)
	}
	return logins, creds, nil
}

// restoreMembers writes s's members (see DirState.Restore): each unless
// the file holds a member of that name, every one with opts.Force.
func (f *LoginFile) restoreMembers(ctx context.Context, s Snapshot, opts RestoreOptions) (RestoreCount, error) {
	var c RestoreCount
	err := f.update(ctx, func(d *loginsDoc) error {
		if d.Members == nil {
			d.Members = map[string]Member{}
		}
		for _, n := range slices.Sorted(maps.Keys(s.Members)) {
			if _, ok := d.Members[n]; ok && !opts.Force {
				c.Kept++
				continue
			}
			m := s.Members[n]
			m.Version = 0
			d.Members[n] = m
			c.Restored++
		}
		return nil
	})
	if err != nil {
		return RestoreCount{}, fmt.Errorf("restore members: %w", err)
	}
	return c, nil
}
