package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// breaker counts consecutive failed Redis calls; threshold of them, the
// first and the last at least a span apart, open it, and only a
// successful probe closes it. The span keeps one slow round trip from
// opening it: the calls that shared it (a pipeline of Admits) fail
// together, within moments.
type breaker struct {
	threshold int64
	fails     atomic.Int64

	mu    sync.Mutex // guards the following field
	first time.Time  // the first failure of the current run

	open atomic.Bool
}

func (b *breaker) isOpen() bool { return b.open.Load() }
func (b *breaker) success()     { b.fails.Store(0) }
func (b *breaker) forceOpen()   { b.open.Store(true) }

// failure records a call that failed at now and reports whether it opened
// the breaker: threshold consecutive failures, the first at least span
// before now.
func (b *breaker) failure(now time.Time, span time.Duration) bool {
	b.mu.Lock()
	n := b.fails.Add(1)
	if n == 1 || b.first.IsZero() {
		b.first = now
	}
	first := b.first
	b.mu.Unlock()
	if n < b.threshold || now.Sub(first) < span {
		return false
	}
	return b.open.CompareAndSwap(false, true)
}

// close closes the breaker and reports whether it was open.
func (b *breaker) close() bool {
	b.mu.Lock()
	b.first = time.Time{}
	b.mu.Unlock()
	b.fails.Store(0)
	return b.open.CompareAndSwap(true, false)
}

// localBit marks reservation ids made by the local share, so Cancel can
// tell them from Redis's (which stay below 2^53).
const localBit = uint64(1) << 62

func isLocalReservation(id uint64) bool { return id&localBit != 0 }

// share is this replica's share of p among live replicas: the data
// plane's rule, rate max(1, rate / n) (0 stays 0) and burst
// ceil(burst / n).
func share(p pacing.Policy, live int) pacing.Policy {
	live = max(live, 1)
	if p.RatePerMinute > 0 {
		p.RatePerMinute = max(1, p.RatePerMinute/live)
	}
	p.Burst = max(1, (p.Burst+live-1)/live)
	return p
}

// fallback holds the local buckets a replica admits from while Redis
// cannot be reached. Each outage starts with new, empty buckets refilling
// at the replica's share of the rate, as a data plane's local fallback
// does: the switch follows admissions Redis just made that this replica
// cannot see, and a full local burst on top of them could release a
// whole extra burst. A bucket whose account had a queue in Redis (the
// latest reservation this replica was granted departs later) starts that
// far below empty: the queued requests dial during the outage, and the
// local share must not admit beside them. The grants it debits are handed
// over to Redis when it answers again.
type fallback struct {
	now func() time.Time

	mu      sync.Mutex // guards the following fields and every *localBucket
	buckets map[string]*localBucket
	queued  map[string]time.Time // account -> the latest departure Redis granted here
}

type localBucket struct {
	bucket  *pacing.Bucket
	share   pacing.Policy
	grants  int
	pending map[uint64]time.Time // reservation (without localBit) -> departure
}

func newFallback(now func() time.Time) *fallback {
	return &fallback{now: now, buckets: map[string]*localBucket{}, queued: map[string]time.Time{}}
}

// queue records that Redis granted a reservation of key departing at dep.
func (f *fallback) queue(key string, dep time.Time) {
	f.mu.Lock()
	if dep.After(f.queued[key]) {
		f.queued[key] = dep
	}
	f.mu.Unlock()
}

// pending reports whether some local bucket holds grants not yet handed
// over.
func (f *fallback) pending() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.buckets) > 0
}

func (f *fallback) admit(key string, p pacing.Policy, live int, now time.Time) store.Admission {
	sh := share(p, live)
	f.mu.Lock()
	defer f.mu.Unlock()
	lb := f.buckets[key]
	if lb == nil {
		tokens := 0.0
		if dep := f.queued[key]; dep.After(now) {
			// The share's part of the queue: the fleet's queue is
			// rate x (dep - now), this replica's share of it that
			// times rate / live.
			tokens = -dep.Sub(now).Minutes() * float64(sh.RatePerMinute)
		}
		delete(f.queued, key)
		lb = &localBucket{bucket: pacing.Restore(sh, pacing.State{Tokens: tokens, Updated: now}), share: sh, pending: map[uint64]time.Time{}}
		f.buckets[key] = lb
	} else if lb.share != sh {
		lb.bucket.SetPolicy(now, sh)
		lb.share = sh
	}
	for id, dep := range lb.pending {
		if !dep.After(now) {
			delete(lb.pending, id)
		}
	}
	d := lb.bucket.Take(now)
	a := store.Admission{Decision: d}
	if d.Debited {
		lb.grants++
		a.Decision.ID = d.ID | localBit
		if d.Wait > 0 {
			lb.pending[d.ID] = now.Add(d.Wait)
			a.Reservation = a.Decision.ID
		}
	}
	return a
}

func (f *fallback) cancel(key string, id uint64, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb := f.buckets[key]
	if lb == nil {
		return false
	}
	id &^= localBit
	dep, ok := lb.pending[id]
	if !ok || !dep.After(now) {
		return false
	}
	delete(lb.pending, id)
	if lb.bucket.RefundReservation(now, id) {
		lb.grants--
		return true
	}
	return false
}

func (f *fallback) tokens(key string, now time.Time) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb := f.buckets[key]; lb != nil {
		return lb.bucket.Tokens(now), true
	}
	return 0, false
}

// keysWith returns the local accounts and extra, sorted and distinct.
func (f *fallback) keysWith(extra []string) []string {
	f.mu.Lock()
	out := append(slices.Collect(maps.Keys(f.buckets)), extra...)
	f.mu.Unlock()
	slices.Sort(out)
	return slices.Compact(out)
}

// drain forgets every local bucket and returns the grants to hand over.
func (f *fallback) drain() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, lb := range f.buckets {
		if lb.grants > 0 {
			out[k] = lb.grants
		}
	}
	clear(f.buckets)
	return out
}

// redisClock is Redis's clock as read by TIME, advanced by the local
// monotonic clock between reads. Before the first read it is the local
// clock.
type redisClock struct {
	p atomic.Pointer[clockReading]
}

type clockReading struct {
	at   time.Time // Redis's time at base
	base time.Time // local instant, with its monotonic reading
}

func (c *redisClock) Now() time.Time {
	r := c.p.Load()
	if r == nil {
		return time.Now()
	}
	return r.at.Add(time.Since(r.base))
}

// syncClock re-reads Redis's clock, placing the reading halfway through
// the round trip.
func (r *Store) syncClock(ctx context.Context) {
	if r.clock == nil {
		return
	}
	var at time.Time
	var sent, got time.Time
	err := r.call(ctx, "time", func(ctx context.Context) error {
		var err error
		sent = time.Now()
		at, err = r.client.Time(ctx).Result()
		got = time.Now()
		return err
	})
	if err != nil {
		return
	}
	r.clock.p.Store(&clockReading{at: at, base: sent.Add(got.Sub(sent) / 2)})
}

// policyCache is the last known stored policies, for the local share and
// for reads while Redis cannot be reached.
type policyCache struct {
	mu      sync.RWMutex // guards the following fields
	m       map[string]record
	version int64 // the highest store-wide version seen
}

func (c *policyCache) get(key string) (record, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	sp, ok := c.m[key]
	return sp, ok
}

// put keeps sp unless the cache holds a newer version, and reports
// whether it changed the cache.
func (c *policyCache) put(key string, sp record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]record{}
	}
	c.version = max(c.version, sp.version)
	if cur, ok := c.m[key]; !ok || cur.version < sp.version || (cur.version == sp.version && cur != sp) {
		c.m[key] = sp
		return true
	}
	return false
}

// keepPolicy keeps a policy record read or written in the cache, and
// tells the backup writer when it is new.
func (r *Store) keepPolicy(key string, sp record) {
	if r.cache.put(key, sp) {
		r.ledger.note()
	}
}

// merge takes m's records (each unless the cache holds a newer one) and
// the version. Policies are never removed, so a record missing from m is
// kept: a store that lost its data must not make this replica forget what
// it would write back.
func (c *policyCache) merge(m map[string]record, version int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]record{}
	}
	for k, rec := range m {
		if cur, ok := c.m[k]; !ok || cur.version <= rec.version {
			c.m[k] = rec
		}
	}
	c.version = max(c.version, version)
}

// raise lifts the highest version seen to at least v.
func (c *policyCache) raise(v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version = max(c.version, v)
}

// all returns a copy of every cached record.
func (c *policyCache) all() map[string]record {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return maps.Clone(c.m)
}

func (c *policyCache) seen() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.version
}

func (c *policyCache) keys() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Collect(maps.Keys(c.m))
}

// reloadPolicies reads every stored policy and the version.
func (r *Store) reloadPolicies(ctx context.Context) error {
	var all map[string]string
	var version int64
	err := r.call(ctx, "policies", func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		h := pipe.HGetAll(ctx, r.policiesKey())
		v := pipe.Get(ctx, r.versionKey())
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		all = h.Val()
		version, _ = v.Int64()
		return nil
	})
	if err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	m := make(map[string]record, len(all))
	for k, rec := range all {
		sp, err := decodeRecord(rec)
		if err != nil {
			r.noteBadPolicy(k, err)
			continue
		}
		m[k] = sp
	}
	before := r.ledgerPolicies()
	r.cache.merge(m, version)
	if r.ledgerPolicies() != before {
		r.ledger.note()
	}
	return nil
}

// ledgerPolicies is a cheap fingerprint of the cached policies, to tell
// a backup writer they changed.
func (r *Store) ledgerPolicies() [2]int64 {
	return [2]int64{int64(len(r.cache.keys())), r.cache.seen()}
}

// checkDefaults records this replica's default policy in Redis, or warns
// when another replica recorded different defaults.
func (r *Store) checkDefaults(ctx context.Context) {
	var cur string
	err := r.call(ctx, "defaults", func(ctx context.Context) error {
		if err := r.client.SetNX(ctx, r.defaultsKey(), r.defRec, 0).Err(); err != nil {
			return err
		}
		var err error
		cur, err = r.client.Get(ctx, r.defaultsKey()).Result()
		return err
	})
	if err == nil && cur != r.defRec {
		r.log.Warn("this replica's default policy differs from the one recorded in redis by another replica; accounts without a stored policy are decided with the defaults of whichever replica serves them",
			"recorded", cur, "this_replica", r.defRec)
	}
}

// register records this replica as live for ReplicaTTL and reads the
// live replica count.
func (r *Store) register(ctx context.Context) {
	now := r.now().UnixMilli()
	var n int64
	err := r.call(ctx, "replicas", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		pipe.ZAdd(ctx, r.replicasKey(), redis.Z{Score: float64(now + ReplicaTTL.Milliseconds()), Member: r.replica})
		pipe.ZRemRangeByScore(ctx, r.replicasKey(), "-inf", strconv.FormatInt(now, 10))
		c := pipe.ZCard(ctx, r.replicasKey())
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		n = c.Val()
		return nil
	})
	if err == nil && n > 0 {
		r.replicas.Store(n)
	}
}

// Run keeps the store current until ctx ends: every Options.Tick it
// registers this replica, re-reads Redis's clock and checks the policy
// version (reloading and notifying every key when a change was missed);
// it delivers other replicas' change notifications to WatchPolicies; and
// while the breaker is open it pings Redis every ProbeEvery, and on an
// answer closes the breaker, hands the local grants over and notifies
// every key. It returns nil when ctx ends, after deregistering.
func (r *Store) Run(ctx context.Context) error {
	ps := r.client.Subscribe(ctx, r.channel, r.credsChannel())
	var wg sync.WaitGroup
	wg.Go(func() { r.receive(ctx, ps) })
	defer func() {
		_ = ps.Close()
		wg.Wait()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
		defer cancel()
		_ = r.client.ZRem(dctx, r.replicasKey(), r.replica).Err()
	}()
	tick := time.NewTicker(r.tick)
	defer tick.Stop()
	probe := time.NewTicker(r.probe)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if r.breaker.isOpen() {
				continue
			}
			r.syncClock(ctx)
			r.register(ctx)
			r.checkVersion(ctx)
			if r.local.pending() {
				// Calls that failed without opening the breaker were
				// decided from the share: hand their grants over, and
				// let the next such call start from an empty bucket.
				r.handOverLocal(ctx)
			}
		case <-r.kick:
			if !r.breaker.isOpen() {
				r.checkVersion(ctx)
			}
		case <-probe.C:
			if r.breaker.isOpen() {
				r.tryClose(ctx)
			}
		}
	}
}

// tryClose pings Redis; on an answer it closes the breaker and resumes
// central admission.
func (r *Store) tryClose(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, r.timeout)
	err := r.client.Ping(pctx).Err()
	cancel()
	if err != nil {
		return
	}
	if !r.breaker.close() {
		return
	}
	r.syncClock(ctx)
	r.register(ctx)
	if err := r.reloadPolicies(ctx); err != nil {
		r.log.Warn("redis answers but policies did not load", "err", err)
	}
	// Redis may have restarted meanwhile, empty or a moment behind.
	r.checkVersion(ctx)
	r.checkPersistence(ctx)
	total, accounts := r.handOverLocal(ctx)
	r.log.Info("redis answers again; central admission resumed", "addr", r.addr,
		"local_grants_handed_over", total, "accounts", accounts)
	r.checkDefaults(ctx)
	r.notify("")
	r.notifyCreds() // changes made while Redis was away went unannounced
}

// handOverLocal hands the grants this replica made from its local share
// over to Redis and forgets its local buckets; it returns the tokens
// debited and the accounts.
func (r *Store) handOverLocal(ctx context.Context) (total, accounts int) {
	grants := r.local.drain()
	report := r.replica + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	now := r.now()
	for key, n := range grants {
		res, err := r.HandOver(ctx, key, n, report, now)
		if err != nil {
			r.log.Warn("hand-over of local grants to redis failed", "account", key, "grants", n, "err", err)
			continue
		}
		total += res.Debited
		r.metrics.replicaHandover.Add(float64(res.Debited))
	}
	return total, len(grants)
}

// checkVersion reads the store's epoch and store-wide version in one
// round trip. An epoch gone or changed is a loss (checkEpoch heals it); a
// version behind the highest seen means Redis lost recent writes (it
// restarted from an AOF or RDB file a moment old), and this replica
// writes its copy back; a version past it means a missed notification:
// the policies are reloaded and every key notified.
func (r *Store) checkVersion(ctx context.Context) {
	var e string
	var v int64
	var vErr error
	err := r.call(ctx, "version", func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		ec := pipe.Get(ctx, r.epochKey())
		vc := pipe.Get(ctx, r.versionKey())
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		e = ec.Val()
		v, vErr = vc.Int64()
		return nil
	})
	if err != nil {
		return
	}
	if !r.checkEpoch(ctx, e) {
		return
	}
	seen := r.cache.seen()
	switch {
	case r.healingNow(): // a write-back that did not finish: again
		if err := r.heal(ctx, "the last write-back did not finish", true); err != nil && ctx.Err() == nil {
			r.log.Warn("writing the durable state back failed; trying again", "err", err)
		}
	case vErr != nil && !errors.Is(vErr, redis.Nil):
		r.log.Error("the store-wide policy version in redis is unreadable; writing it back", "key", r.versionKey(), "err", vErr)
		_, _ = r.runAll(ctx, "restore", scriptRestoreCounter, []scriptCall{{keys: []string{r.versionKey()}, args: []any{seen + VersionGap}}})
	case v < seen:
		loss := fmt.Sprintf("the store-wide policy version went back from %d to %d: redis lost its most recent writes (a restart from an AOF or RDB file a moment old)", seen, v)
		if err := r.heal(ctx, loss, true); err != nil && ctx.Err() == nil {
			r.log.Warn("writing the durable state back failed; trying again", "err", err)
		}
	case v > seen:
		if r.reloadPolicies(ctx) == nil {
			r.notify("")
		}
	}
}

// suspect asks Run to check the store now: a read found a record missing
// or older than this replica's copy.
func (r *Store) suspect() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// receive delivers other replicas' notifications ("key version replica")
// until ps closes.
func (r *Store) receive(ctx context.Context, ps *redis.PubSub) {
	for msg := range ps.Channel() {
		if msg.Channel == r.credsChannel() {
			r.credsNotice(msg.Payload)
			continue
		}
		f := strings.Fields(msg.Payload)
		if len(f) != 3 || f[2] == r.replica {
			continue
		}
		key := f[0]
		if key == "*" { // a restore: every policy may have changed
			if r.reloadPolicies(ctx) == nil {
				r.notify("")
			}
			continue
		}
		var rec string
		err := r.call(ctx, "policy", func(ctx context.Context) error {
			var err error
			rec, err = r.client.HGet(ctx, r.policiesKey(), key).Result()
			return err
		})
		if err == nil {
			if sp, err := decodeRecord(rec); err == nil {
				r.keepPolicy(key, sp)
			}
		}
		r.notify(key)
	}
}
