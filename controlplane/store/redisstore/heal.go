package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

// Healing: how a replica writes back what a store lost.
const (
	// VersionGap is how far a write-back raises the store-wide policy
	// version past the highest this replica saw, so a change made after
	// the loss is newer than any copy another replica may still put back.
	VersionGap = 1 << 20
	// HealQuiet is how long no refresh lease is handed out once a replica
	// begins writing its state back: every replica notices a loss within
	// two ticks and puts back the leases it held (and its newer sign-ins)
	// before anyone may refresh again, so no two replicas refresh one
	// account and no rotated refresh token is redeemed twice.
	HealQuiet = 5 * time.Second
	// RestoreQuiet is the same after a start that restored an empty
	// store from a backup: replicas started beside it (within this) put
	// back newer copies from their own backups before anyone refreshes.
	RestoreQuiet = 10 * time.Second
)

var (
	scriptRestorePolicy  = mustPlainScript("restore_policy")
	scriptRestoreLogin   = mustPlainScript("restore_login")
	scriptRestoreCred    = mustPlainScript("restore_cred")
	scriptRestoreRemoved = mustPlainScript("restore_removed")
	scriptRestoreCounter = mustPlainScript("restore_counter")
	scriptRestoreLease   = mustPlainScript("restore_lease")
)

// heal writes the durable state this replica holds back into a store that
// lost it (loss says what was found), then serves under the store's
// epoch: the one another replica set after the loss, or a new one. With
// intact, the epoch is the known one and the store lost only recent
// writes (a Redis restarted from an AOF or RDB file a moment old): the
// state is written back under the same epoch. It runs once at a time; a
// store this replica already healed is left alone.
func (r *Store) heal(ctx context.Context, loss string, intact bool) error {
	r.healMu.Lock()
	defer r.healMu.Unlock()
	known := r.knownEpoch()
	cur, err := r.readEpoch(ctx)
	if err != nil {
		return err
	}
	if !intact && cur == known && !r.healingNow() {
		return nil // healed meanwhile
	}
	start := time.Now()
	if !r.healingNow() {
		logins, creds, _, _, _ := r.ledger.copyOf()
		r.markLost(loss)
		r.metrics.losses.Inc()
		r.log.Error("redis lost data; writing the durable state back from this replica's memory",
			"loss", loss, "addr", r.addr, "policies", len(r.cache.keys()), "sign_ins", len(logins), "agent_credentials", len(creds),
			"members", len(r.ledger.membersCopy()))
	}
	res, err := r.writeBack(ctx, r.quiet)
	if err != nil {
		return err
	}
	if cur == "" {
		if cur, err = r.setEpoch(ctx, newEpoch(known, r.now())); err != nil {
			return err
		}
	}
	r.adopt(cur)
	// Accounts decided from the local share while Redis had lost their
	// policy: their grants go to the buckets Redis keeps now.
	r.handOverLocal(ctx)
	took := time.Since(start)
	r.metrics.restoreSeconds.Set(took.Seconds())
	r.markRestored(fmt.Sprintf("%s from this replica's memory in %v", res, took.Round(time.Millisecond)))
	r.log.Info("the durable state is back in redis", "restored", res.String(), "took", took.Round(time.Millisecond),
		"epoch", epochID(cur), "refresh_leases_wait", r.quiet)
	r.publishAll(ctx)
	return nil
}

func (r *Store) healingNow() bool {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	return r.epoch.healing
}

// errHealing answers a durable write the store cannot take yet: it lost
// its data and this replica has not written its state back.
var errHealing = fmt.Errorf("%w: the store lost its data and is being restored from the replicas; try again in a moment", store.ErrUnavailable)

// healNow serves a durable write that found the store's epoch not the one
// this replica serves under: it heals, then the write is retried once.
func (r *Store) healNow(ctx context.Context) error {
	cur, err := r.readEpoch(ctx)
	if err != nil {
		return err
	}
	if r.knownEpoch() == "" {
		if err := r.firstContact(ctx); err != nil {
			return err
		}
	} else if cur != r.knownEpoch() {
		r.checkEpoch(ctx, cur)
	}
	if r.knownEpoch() == "" || r.healingNow() {
		return errHealing
	}
	return nil
}

// writeBack puts this replica's copy of the durable state back: first
// the mark that holds refresh leases for quiet, the leases it holds and
// its fencing counters, then the removals, the policies (and the
// store-wide version past them), the sign-ins, the agent credentials and
// the members.
// Every write is conditional on the store holding no newer version.
func (r *Store) writeBack(ctx context.Context, quiet time.Duration) (store.RestoreResult, error) {
	var res store.RestoreResult
	logins, creds, removed, leases, fences := r.ledger.copyOf()
	err := r.call(ctx, "restore", func(ctx context.Context) error {
		return r.client.Set(ctx, r.healingKey(), r.replica, quiet).Err()
	})
	if err != nil {
		return res, fmt.Errorf("write back: %w", err)
	}
	var calls []scriptCall
	for key, h := range leases {
		if left := time.Until(h.until); left > 0 {
			calls = append(calls, scriptCall{keys: []string{r.leaseKey(key)}, args: []any{strconv.FormatInt(h.fence, 10), left.Milliseconds()}})
		}
	}
	if got, err := r.runAll(ctx, "restore", scriptRestoreLease, calls); err != nil {
		return res, fmt.Errorf("write back the refresh leases: %w", err)
	} else if n := len(got) - count(got); n > 0 {
		r.log.Error("a refresh lease this replica held is held by another replica after the loss", "leases", n)
	}
	calls = calls[:0]
	for key, f := range fences {
		calls = append(calls, scriptCall{keys: []string{r.fenceKey(key)}, args: []any{f}})
	}
	if _, err := r.runAll(ctx, "restore", scriptRestoreCounter, calls); err != nil {
		return res, fmt.Errorf("write back the fencing counters: %w", err)
	}
	if err := r.writeRemoved(ctx, removed); err != nil {
		return res, err
	}
	pol, err := r.writePolicies(ctx, r.cache.all())
	if err != nil {
		return res, err
	}
	res.Policies = pol
	floor := r.cache.seen() + VersionGap
	if _, err := r.runAll(ctx, "restore", scriptRestoreCounter, []scriptCall{{keys: []string{r.versionKey()}, args: []any{floor}}}); err != nil {
		return res, fmt.Errorf("write back the policy version: %w", err)
	}
	r.cache.raise(floor)
	if res.Logins, err = r.writeLogins(ctx, slices.Collect(maps.Values(logins))); err != nil {
		return res, err
	}
	if res.AgentCreds, err = r.writeCreds(ctx, slices.Collect(maps.Values(creds))); err != nil {
		return res, err
	}
	if res.Members, err = r.writeMembers(ctx, slices.Collect(maps.Values(r.ledger.membersCopy())), false); err != nil {
		return res, err
	}
	if c := r.ledger.keyCanary(); c != nil {
		if err := r.putCanary(ctx, c, false); err != nil {
			return res, err
		}
	}
	r.checkDefaults(ctx)
	r.register(ctx)
	return res, nil
}

func count(v []int64) int {
	n := 0
	for _, x := range v {
		if x == 1 {
			n++
		}
	}
	return n
}

func (r *Store) writeRemoved(ctx context.Context, removed map[string]int64) error {
	var calls []scriptCall
	for f, v := range removed {
		kind, name, ok := cutKind(f)
		if !ok {
			continue
		}
		c := scriptCall{keys: []string{r.removedKey(), r.loginKey(name), r.loginsIndex()}, args: []any{kind, name, v}}
		switch kind {
		case "cred":
			c.keys = []string{r.removedKey(), r.agentCredsKey(), r.agentCredVersionsKey()}
		case memberKind:
			c.keys = []string{r.removedKey(), r.membersKey(), r.memberVersionsKey()}
		}
		calls = append(calls, c)
	}
	if _, err := r.runAll(ctx, "restore", scriptRestoreRemoved, calls); err != nil {
		return fmt.Errorf("write back the removals: %w", err)
	}
	return nil
}

// cutKind splits a removals field "login:KEY", "cred:NAME" or
// "member:NAME".
func cutKind(f string) (kind, name string, ok bool) {
	for _, k := range []string{"login", "cred", memberKind} {
		if len(f) > len(k)+1 && f[:len(k)+1] == k+":" {
			return k, f[len(k)+1:], true
		}
	}
	return "", "", false
}

func (r *Store) writePolicies(ctx context.Context, recs map[string]record) (store.RestoreCount, error) {
	keys := slices.Sorted(maps.Keys(recs))
	calls := make([]scriptCall, 0, len(keys))
	for _, k := range keys {
		rec := recs[k]
		calls = append(calls, scriptCall{keys: []string{r.policiesKey(), r.versionKey(), r.adaptiveKey()},
			args: []any{k, strconv.FormatInt(rec.version, 10) + " " + encodeRecord(rec.policy, rec.adaptive)}})
	}
	got, err := r.runAll(ctx, "restore", scriptRestorePolicy, calls)
	if err != nil {
		return store.RestoreCount{}, fmt.Errorf("write back the policies: %w", err)
	}
	n := count(got)
	r.metrics.restored.WithLabelValues("policy").Add(float64(n))
	return store.RestoreCount{Restored: n, Kept: len(got) - n}, nil
}

func (r *Store) writeLogins(ctx context.Context, ls []store.Login) (store.RestoreCount, error) {
	calls := make([]scriptCall, 0, len(ls))
	for _, l := range ls {
		data, err := json.Marshal(l)
		if err != nil {
			return store.RestoreCount{}, fmt.Errorf("encode login %s: %w", l.Key, err)
		}
		calls = append(calls, scriptCall{keys: []string{r.loginKey(l.Key), r.loginsIndex(), r.removedKey()},
			args: []any{l.Key, l.Generation, string(data), "0"}})
	}
	got, err := r.runAll(ctx, "restore", scriptRestoreLogin, calls)
	if err != nil {
		return store.RestoreCount{}, fmt.Errorf("write back the sign-ins: %w", err)
	}
	n := count(got)
	r.metrics.restored.WithLabelValues("sign_in").Add(float64(n))
	return store.RestoreCount{Restored: n, Kept: len(got) - n}, nil
}

func (r *Store) writeCreds(ctx context.Context, cs []store.AgentCred) (store.RestoreCount, error) {
	calls := make([]scriptCall, 0, len(cs))
	for _, c := range cs {
		data, err := json.Marshal(store.AgentCred{Name: c.Name, Digest: c.Digest, Accounts: c.Accounts, Created: c.Created})
		if err != nil {
			return store.RestoreCount{}, fmt.Errorf("encode agent credential %s: %w", c.Name, err)
		}
		calls = append(calls, scriptCall{keys: []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey()},
			args: []any{c.Name, max(c.Version, 1), string(data), "0"}})
	}
	got, err := r.runAll(ctx, "restore", scriptRestoreCred, calls)
	if err != nil {
		return store.RestoreCount{}, fmt.Errorf("write back the agent credentials: %w", err)
	}
	n := count(got)
	r.metrics.restored.WithLabelValues("agent_credential").Add(float64(n))
	return store.RestoreCount{Restored: n, Kept: len(got) - n}, nil
}

// publishAll tells every replica (and this one's watchers) that every
// policy may have changed.
func (r *Store) publishAll(ctx context.Context) {
	_ = r.call(ctx, "publish", func(ctx context.Context) error {
		return r.client.Publish(ctx, r.channel, "* "+strconv.FormatInt(r.cache.seen(), 10)+" "+r.replica).Err()
	})
	r.notify("")
}

// scriptCall is one script invocation of runAll.
type scriptCall struct {
	keys []string
	args []any
}

// runAll runs s once per call, pipelined in batches, and returns each
// integer reply.
func (r *Store) runAll(ctx context.Context, op string, s *redis.Script, calls []scriptCall) ([]int64, error) {
	out := make([]int64, 0, len(calls))
	const batch = 256
	for i := 0; i < len(calls); i += batch {
		chunk := calls[i:min(i+batch, len(calls))]
		var cmds []*redis.Cmd
		err := r.call(ctx, op, func(ctx context.Context) error {
			send := func() error {
				pipe := r.client.Pipeline()
				cmds = make([]*redis.Cmd, len(chunk))
				for j, c := range chunk {
					cmds[j] = s.EvalSha(ctx, pipe, c.keys, c.args...)
				}
				_, err := pipe.Exec(ctx)
				return err
			}
			err := send()
			if isNoScript(err) {
				if err := s.Load(ctx, r.client).Err(); err != nil {
					return err
				}
				err = send()
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, c := range cmds {
			n, err := c.Int64()
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
	}
	return out, nil
}

// mergeSnapshot takes a snapshot's records into this replica's copy,
// each unless the copy is newer.
func (r *Store) mergeSnapshot(s store.Snapshot) {
	for k, p := range s.Policies {
		r.keepPolicy(k, record{version: p.Version, policy: resolve(p.Policy()), adaptive: p.Adaptive})
	}
	r.cache.raise(s.Version)
	if s.KeyCanary != nil && r.ledger.keyCanary() == nil {
		r.ledger.setCanary(s.KeyCanary)
	}
	for _, l := range s.Logins {
		r.ledger.putLogin(l)
	}
	for _, c := range s.AgentCreds {
		r.ledger.putCred(c)
	}
	for _, m := range s.Members {
		r.ledger.putMember(m)
	}
	r.ledger.noteRemoved(s.Removed)
}

// Snapshot returns the durable state: read from Redis when it answers
// (and taken into this replica's copy), else this replica's copy.
func (r *Store) Snapshot(ctx context.Context) (store.Snapshot, error) {
	if err := r.reloadPolicies(ctx); err != nil && ctx.Err() != nil {
		return store.Snapshot{}, ctx.Err()
	}
	r.loadDurable(ctx)
	return r.copySnapshot(), nil
}

// copySnapshot is this replica's copy of the durable state, for backups.
func (r *Store) copySnapshot() store.Snapshot {
	logins, creds, removed, _, _ := r.ledger.copyOf()
	s := store.Snapshot{
		Created: r.now().UTC(), Kind: "redis", Replica: r.replica, Epoch: r.knownEpoch(), Version: r.cache.seen(),
		Policies: map[string]store.PolicyRecord{}, Logins: logins, AgentCreds: creds, Members: r.ledger.membersCopy(),
		Removed: removed, KeyCanary: r.ledger.keyCanary(),
	}
	for k, rec := range r.cache.all() {
		s.Policies[k] = store.NewPolicyRecord(rec.policy, rec.adaptive, rec.version)
	}
	return s
}

// Changes counts the changes of this replica's copy of the durable state
// (for backups: the copy is read only when it moved), and Changed wakes a
// backup writer on each.
func (r *Store) Changes() uint64 { return r.ledger.changes.Load() }

// Changed signals each change of the durable state (at most one pending).
func (r *Store) Changed() <-chan struct{} { return r.ledger.changed }

// BackupState is Snapshot from this replica's copy alone (no Redis call),
// what a backup writer reads every change.
func (r *Store) BackupState(context.Context) (store.Snapshot, error) { return r.copySnapshot(), nil }

// Restore puts a snapshot (a backup) back into the store: each record
// unless the store holds it in the same or a newer version, or removed
// it since; with opts.Force every record is written as a new change. The
// other replicas learn the change within a tick.
func (r *Store) Restore(ctx context.Context, s store.Snapshot, opts store.RestoreOptions) (store.RestoreResult, error) {
	res, err := r.restoreSnapshot(ctx, s, opts)
	if err != nil {
		return res, err
	}
	r.markRestored(fmt.Sprintf("%s from a backup written %s by %s", res, s.Created.UTC().Format(time.RFC3339), s.Replica))
	r.publishAll(ctx)
	return res, nil
}

func (r *Store) restoreSnapshot(ctx context.Context, s store.Snapshot, opts store.RestoreOptions) (store.RestoreResult, error) {
	var res store.RestoreResult
	if opts.Force {
		return r.forceSnapshot(ctx, s)
	}
	if err := r.writeRemoved(ctx, s.Removed); err != nil {
		return res, err
	}
	recs := make(map[string]record, len(s.Policies))
	for k, p := range s.Policies {
		recs[k] = record{version: p.Version, policy: resolve(p.Policy()), adaptive: p.Adaptive}
	}
	var err error
	if res.Policies, err = r.writePolicies(ctx, recs); err != nil {
		return res, err
	}
	if _, err := r.runAll(ctx, "restore", scriptRestoreCounter, []scriptCall{{keys: []string{r.versionKey()}, args: []any{s.Version}}}); err != nil {
		return res, fmt.Errorf("restore the policy version: %w", err)
	}
	if res.Logins, err = r.writeLogins(ctx, slices.Collect(maps.Values(s.Logins))); err != nil {
		return res, err
	}
	if res.AgentCreds, err = r.writeCreds(ctx, slices.Collect(maps.Values(s.AgentCreds))); err != nil {
		return res, err
	}
	if res.Members, err = r.writeMembers(ctx, slices.Collect(maps.Values(s.Members)), false); err != nil {
		return res, err
	}
	if s.KeyCanary != nil {
		if err := r.putCanary(ctx, s.KeyCanary, false); err != nil {
			return res, err
		}
	}
	_ = r.reloadPolicies(ctx)
	r.loadDurable(ctx)
	return res, nil
}

// forceSnapshot writes every record of s as a new change.
func (r *Store) forceSnapshot(ctx context.Context, s store.Snapshot) (store.RestoreResult, error) {
	var res store.RestoreResult
	now := r.now()
	for _, k := range slices.Sorted(maps.Keys(s.Policies)) {
		p := s.Policies[k]
		if _, err := r.updateStored(ctx, k, now, func(record) (record, error) {
			return record{policy: resolve(p.Policy()), adaptive: p.Adaptive}, nil
		}); err != nil {
			return res, fmt.Errorf("restore the policy of %s: %w", k, err)
		}
		res.Policies.Restored++
	}
	for _, k := range slices.Sorted(maps.Keys(s.Logins)) {
		l := s.Logins[k]
		lease, err := r.AcquireLease(ctx, k, 45*time.Second)
		if err != nil {
			return res, fmt.Errorf("restore the sign-in of %s: %w", k, err)
		}
		l.Generation = -1 // replace whatever is stored
		_, err = r.PutLogin(ctx, l, lease)
		_ = lease.Release()
		if err != nil {
			return res, fmt.Errorf("restore the sign-in of %s: %w", k, err)
		}
		res.Logins.Restored++
	}
	for _, n := range slices.Sorted(maps.Keys(s.AgentCreds)) {
		if err := r.PutAgentCred(ctx, s.AgentCreds[n]); err != nil {
			return res, fmt.Errorf("restore agent credential %s: %w", n, err)
		}
		res.AgentCreds.Restored++
	}
	for _, n := range slices.Sorted(maps.Keys(s.Members)) {
		if err := r.PutMember(ctx, s.Members[n]); err != nil {
			return res, fmt.Errorf("restore member %s: %w", n, err)
		}
		res.Members.Restored++
	}
	return res, nil
}
