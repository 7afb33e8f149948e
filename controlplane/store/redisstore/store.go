package redisstore

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// Redis defaults.
const (
	// DefaultTimeout is the shortest deadline of one Redis call; the
	// deadline follows observed latency above it (deadline.go).
	DefaultTimeout = 100 * time.Millisecond
	// DefaultMaxTimeout is the longest deadline of one Redis call.
	DefaultMaxTimeout = time.Second
	// answerMargin is kept of a caller's own deadline to answer it from
	// the local share when Redis does not answer in time.
	answerMargin = 30 * time.Millisecond
	// DefaultBreakerFailures is how many consecutive failed Redis calls
	// open the breaker.
	DefaultBreakerFailures = 3
	// DefaultProbeEvery is how often an open breaker pings Redis.
	DefaultProbeEvery = 250 * time.Millisecond
	// DefaultPrefix prefixes every Redis key and channel.
	DefaultPrefix = "clodex:"
	// ReplicaTTL is how long a replica counts as live after its last
	// registration (it registers every Options.Tick).
	ReplicaTTL = 5 * time.Second
)

// Options configures Open. The zero value is not usable: URL is
// required.
type Options struct {
	// URL locates Redis: redis://[user:password@]host:port[/db],
	// rediss://... for TLS, or Sentinel:
	// redis://[user:password@]sentinel:26379[/db]?master_name=NAME&addr=sentinel2:26379
	// (every Sentinel in host and addr). go-redis's URL query options are
	// accepted. (Required)
	URL string
	// Prefix prefixes every key and channel, so several teams can share
	// one Redis. (Optional; default "clodex:")
	Prefix string
	// Defaults is the policy for accounts without a stored policy. Every
	// replica must use the same; a replica whose defaults differ from the
	// ones recorded in Redis says so at start. (Optional; default
	// pacing.DefaultPolicy())
	Defaults *pacing.Policy
	// Now is the clock. (Optional; default Redis's clock: TIME, re-read
	// every Tick and advanced by the local monotonic clock in between, so
	// every replica decides on one clock with Redis's microsecond
	// resolution.)
	Now func() time.Time
	// Timeout is the shortest deadline of a Redis call: the deadline is
	// 4 x the slowest call of the last 10 s, at least Timeout and at most
	// MaxTimeout, and never past the caller's own deadline less 30 ms.
	// (Optional; default 100ms)
	Timeout time.Duration
	// MaxTimeout is the longest deadline of a Redis call. (Optional;
	// default 1s, or Timeout when that is longer)
	MaxTimeout time.Duration
	// BreakerFailures is how many consecutive failed calls open the
	// breaker. (Optional; default 3)
	BreakerFailures int
	// ProbeEvery is how often an open breaker pings Redis. (Optional;
	// default 250ms)
	ProbeEvery time.Duration
	// Tick is how often Run registers this replica, re-reads Redis's
	// clock and checks the policy version. (Optional; default 1s)
	Tick time.Duration
	// Replica names this replica in Redis. (Optional; default
	// hostname-random)
	Replica string
	// IdleTTL is how long an account's state outlives the moment its
	// bucket is full again (and its adaptive rate recovered). (Optional;
	// default 10m, as Memory's sweep)
	IdleTTL time.Duration
	// Logger receives the store's notices. (Optional; default discards)
	Logger *slog.Logger
	// Registerer receives the store's metrics. (Optional)
	Registerer prometheus.Registerer
	// HealQuiet is how long no refresh lease is handed out once a replica
	// begins writing its state back after a loss. (Optional; default
	// HealQuiet, 5s)
	HealQuiet time.Duration
	// RestoreQuiet is the same after a start restored an empty store from
	// a backup. (Optional; default RestoreQuiet, 10s)
	RestoreQuiet time.Duration
	// Backup returns this replica's newest backup (a BackupDir's Newest):
	// an empty store (no epoch) is restored from it, and a store whose
	// epoch it was taken under gets its newer records back. (Optional;
	// default none: an empty store starts new, and says so)
	Backup func() (snap store.Snapshot, path string, skipped []string, err error)
}

//go:embed lua/*.lua
var luaFS embed.FS

func mustScript(name string) *redis.Script {
	pre, err := luaFS.ReadFile("lua/prelude.lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(pre) + "\n" + string(mustLua(name)))
}

func mustLua(name string) []byte {
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return body
}

var (
	// scriptAdmit runs on every Admit: it is written out without the
	// prelude (see admit.lua).
	scriptAdmit     = redis.NewScript(string(mustLua("admit")))
	scriptCancel    = mustScript("cancel")
	scriptAccount   = mustScript("account")
	scriptUpdate    = mustScript("update")
	scriptReport403 = mustScript("report403")
	scriptAdapt     = mustScript("adapt")
	scriptHandOver  = mustScript("handover")
)

// Store is the store shared by control-plane replicas. Every decision is
// one Lua script over one hash per account (with a time to live), the
// bucket math of internal/pacing mirrored in integers; policies live in
// one hash with a store-wide version, and every change is published so
// each replica can push it to its agents.
//
// Every Redis call has a hard deadline; consecutive failures open a
// breaker, and while it is open Admit answers from a local bucket holding
// this replica's share of the policy (rate and burst divided by the live
// replicas; empty when the outage starts, refilling at the share's rate),
// says so once, and hands its local grants over when Redis answers again.
// A call that timed out may still run when Redis recovers; it then counts
// twice, which errs toward fewer admissions. It is safe for concurrent
// use.
type Store struct {
	client   redis.UniversalClient
	admits   *batcher // Admit's script calls, auto-pipelined
	addr     string   // for display: no credentials
	prefix   string
	channel  string
	defaults pacing.Policy
	defRec   string // the default record, version 0
	now      func() time.Time
	clock    *redisClock   // nil when Options.Now is set
	timeout  time.Duration // Options.Timeout: the shortest deadline, the probe's
	deadline *deadline     // a call's deadline now
	probe    time.Duration
	tick     time.Duration
	idleMs   int64
	replica  string
	log      *slog.Logger
	metrics  *redisMetrics

	breaker breaker
	local   *fallback
	// memberLocal holds the members' local shares (memberbuckets.go); its
	// grants are never handed over.
	memberLocal *fallback
	cache       policyCache

	replicas atomic.Int64 // live replicas, as last read

	// The durable state this replica holds and the store's epoch
	// (epoch.go, heal.go, ledger.go): what is written back when the store
	// loses it.
	ledger  *ledger
	epoch   epochState
	healMu  sync.Mutex // one heal or first contact at a time
	backups func() (store.Snapshot, string, []string, error)
	// quiet and restoreQuiet are Options.HealQuiet and RestoreQuiet.
	quiet, restoreQuiet time.Duration
	// kick asks Run to check the store now (size 1): a read found a
	// record missing that this replica holds.
	kick chan struct{}
	// noted are the records already reported unreadable or lost (key ->
	// struct{}), so each is logged once until it is readable again.
	noted sync.Map

	mu           sync.Mutex // guards the following fields
	watchers     []func(key string)
	credWatchers []func() // WatchAgentCreds
}

// Open connects to Redis and returns the store. A malformed URL or a
// Redis that refuses the credentials is an error; an unreachable one is
// not: the store starts degraded (admitting from its share, with the
// local clock until Redis answers) and says so.
func Open(ctx context.Context, opts Options) (*Store, error) {
	r := &Store{
		prefix:       opts.Prefix,
		defaults:     pacing.DefaultPolicy(),
		timeout:      opts.Timeout,
		probe:        opts.ProbeEvery,
		tick:         opts.Tick,
		replica:      opts.Replica,
		log:          opts.Logger,
		ledger:       newLedger(),
		backups:      opts.Backup,
		quiet:        opts.HealQuiet,
		restoreQuiet: opts.RestoreQuiet,
		kick:         make(chan struct{}, 1),
	}
	if r.prefix == "" {
		r.prefix = DefaultPrefix
	}
	if opts.Defaults != nil {
		r.defaults = *opts.Defaults
	}
	if r.timeout <= 0 {
		r.timeout = DefaultTimeout
	}
	ceiling := opts.MaxTimeout
	if ceiling <= 0 {
		ceiling = DefaultMaxTimeout
	}
	r.deadline = newDeadline(r.timeout, ceiling)
	if r.probe <= 0 {
		r.probe = DefaultProbeEvery
	}
	if r.tick <= 0 {
		r.tick = time.Second
	}
	if r.quiet <= 0 {
		r.quiet = HealQuiet
	}
	if r.restoreQuiet <= 0 {
		r.restoreQuiet = RestoreQuiet
	}
	idle := opts.IdleTTL
	if idle <= 0 {
		idle = 10 * time.Minute
	}
	r.idleMs = idle.Milliseconds()
	if r.replica == "" {
		r.replica = replicaID()
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.log = r.log.With("component", "store", "store", "redis")
	failures := opts.BreakerFailures
	if failures <= 0 {
		failures = DefaultBreakerFailures
	}
	r.breaker.threshold = int64(failures)
	r.channel = r.prefix + "policy"
	r.defRec = "0 " + encodeRecord(r.defaults, store.DefaultAdaptive)
	r.replicas.Store(1)

	client, addr, err := newClient(opts.URL, r.deadline.ceiling)
	if err != nil {
		return nil, fmt.Errorf("open redis store: %w", err)
	}
	r.client, r.addr = client, addr
	r.metrics = newRedisMetrics(r)
	if opts.Registerer != nil {
		if err := r.metrics.register(opts.Registerer); err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("open redis store: register metrics: %w", err)
		}
	}
	r.admits = newAdmitBatcher(r)
	if opts.Now != nil {
		r.now = opts.Now
	} else {
		r.clock = &redisClock{}
		r.now = r.clock.Now
	}
	r.local = newFallback(r.now)
	r.memberLocal = newFallback(r.now)

	// First contact: credentials and the clock. Unreachable is not fatal.
	sctx, cancel := context.WithTimeout(ctx, max(r.timeout, time.Second))
	defer cancel()
	if err := r.client.Ping(sctx).Err(); err != nil {
		if isAuthError(err) {
			_ = r.Close()
			return nil, fmt.Errorf("open redis store %s: %w", r.addr, err)
		}
		r.breaker.forceOpen()
		r.metrics.breakerOpen()
		r.log.Warn("redis unreachable at start; admitting from this replica's share of each policy until it answers",
			"addr", r.addr, "err", err)
		return r, nil
	}
	r.syncClock(sctx)
	if err := r.reloadPolicies(sctx); err != nil {
		r.log.Warn("redis policies not loaded yet", "err", err)
	}
	r.checkDefaults(sctx)
	r.register(sctx)
	r.checkPersistence(sctx)
	// The epoch and the first restore may write many records: they get
	// their own bound.
	ectx, ecancel := context.WithTimeout(ctx, 30*time.Second)
	defer ecancel()
	if err := r.firstContact(ectx); err != nil {
		r.log.Warn("the store's epoch could not be read at start; trying again every tick", "err", err)
	}
	return r, nil
}

// newClient builds the client for url and returns it with the
// address to display.
func newClient(raw string, timeout time.Duration) (redis.UniversalClient, string, error) {
	if raw == "" {
		return nil, "", errors.New("redis URL is empty; want redis://host:port, rediss://host:port or a Sentinel URL with master_name")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return nil, "", fmt.Errorf("redis URL %q is invalid; want redis://[user:password@]host:port[/db], rediss://... or redis://sentinel:26379?master_name=NAME", redact(raw))
	}
	display := u.Scheme + "://" + u.Host + u.Path
	poolSize := max(128, 10*runtime.GOMAXPROCS(0))
	if u.Query().Has("master_name") {
		fo, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, "", fmt.Errorf("redis Sentinel URL %q: %w", redact(raw), err)
		}
		fo.MaxRetries = -1
		fo.DialTimeout, fo.ReadTimeout, fo.WriteTimeout, fo.PoolTimeout = timeout, timeout, timeout, timeout
		fo.ContextTimeoutEnabled = true
		fo.PoolSize = poolSize
		return redis.NewFailoverClient(fo), display + " (sentinel, master " + fo.MasterName + ")", nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("redis URL %q: %w", redact(raw), err)
	}
	o.MaxRetries = -1
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout, timeout
	o.ContextTimeoutEnabled = true
	o.PoolSize = poolSize
	return redis.NewClient(o), display, nil
}

// redact drops the credentials from a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return u.String()
}

// Check proves the Redis at rawURL answers a PING within
// max(timeout, 1s) with the URL's credentials, as Open's first contact
// does; unlike Open, an unreachable Redis is an error. It keeps no
// connection.
func Check(ctx context.Context, rawURL string, timeout time.Duration) error {
	client, addr, err := newClient(rawURL, timeout)
	if err != nil {
		return fmt.Errorf("check redis: %w", err)
	}
	defer func() { _ = client.Close() }()
	cctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	if err := client.Ping(cctx).Err(); err != nil {
		if isAuthError(err) {
			return fmt.Errorf("check redis %s: credentials refused: %w", addr, err)
		}
		return fmt.Errorf("check redis %s: unreachable (a replica would start degraded, admitting from its share): %w", addr, err)
	}
	return nil
}

func isAuthError(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") || strings.Contains(msg, "invalid password")
}

func replicaID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	host, _ := os.Hostname()
	if host == "" {
		host = "replica"
	}
	return host + "-" + hex.EncodeToString(b)
}

// Close stops the store's pipelines and closes the Redis client.
func (r *Store) Close() error {
	r.admits.close()
	return r.client.Close()
}

// Now returns the store's clock: Redis's, unless Options.Now was set.
// The control plane decides every request on it.
func (r *Store) Now() time.Time { return r.now() }

// Defaults returns the policy for accounts without a stored policy.
func (r *Store) Defaults() pacing.Policy { return r.defaults }

// Replica returns this replica's id.
func (r *Store) Replica() string { return r.replica }

// Info describes the store: kind "redis", the address without
// credentials, this replica and the live replica count.
func (r *Store) Info() store.Info {
	i := store.Info{Kind: "redis", Address: r.addr, Replica: r.replica, Replicas: int(r.replicas.Load()), Degraded: r.breaker.isOpen()}
	r.fillInfo(&i)
	return i
}

// WatchPolicies registers fn to be called with the key whose policy or
// effective rate another replica changed, and with "" when notifications
// may have been missed (every key may have changed). fn runs on Run's
// goroutine and must not block.
func (r *Store) WatchPolicies(fn func(key string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers = append(r.watchers, fn)
}

func (r *Store) notify(key string) {
	r.mu.Lock()
	ws := append([]func(string){}, r.watchers...)
	r.mu.Unlock()
	for _, fn := range ws {
		fn(key)
	}
}

func (r *Store) acctKey(key string) string { return r.prefix + "a:" + key }
func (r *Store) policiesKey() string       { return r.prefix + "policies" }
func (r *Store) versionKey() string        { return r.prefix + "version" }
func (r *Store) adaptiveKey() string       { return r.prefix + "adaptive" }
func (r *Store) replicasKey() string       { return r.prefix + "replicas" }
func (r *Store) defaultsKey() string       { return r.prefix + "defaults" }

// micros is the instant the scripts use: microseconds since the epoch.
func micros(t time.Time) int64 { return t.UnixMicro() }

// call runs fn with the Redis deadline and keeps the breaker. It returns
// errDegraded without calling fn while the breaker is open. A failure the
// caller caused (its context ended) does not count against Redis. The
// deadline is the adaptive one (deadline.go), cut to leave answerMargin
// of ctx's own deadline, so a caller is answered (from the local share)
// before it gives up.
func (r *Store) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	if r.breaker.isOpen() {
		return errDegraded
	}
	limit := r.deadline.get()
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		limit = min(limit, max(left-answerMargin, left/2))
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	start := time.Now()
	err := fn(cctx)
	cancel()
	return r.settle(ctx, op, start, limit, err)
}

// callPipelined is call for a batcher's calls, whose pipeline carries
// the Redis deadline (one per pipeline, not one per call). Only a caller
// whose own deadline is nearer than the pipeline's gets a deadline of
// its own (a timer), cut as call cuts it.
func (r *Store) callPipelined(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	if r.breaker.isOpen() {
		return errDegraded
	}
	limit := r.deadline.get()
	cctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left-answerMargin < limit {
			limit = max(left-answerMargin, left/2)
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(ctx, limit)
			defer cancel()
		}
	}
	start := time.Now()
	return r.settle(ctx, op, start, limit, fn(cctx))
}

// settle records the outcome of a call begun at start under deadline
// limit, keeps the adaptive deadline and the breaker.
func (r *Store) settle(ctx context.Context, op string, start time.Time, limit time.Duration, err error) error {
	end := time.Now()
	took := end.Sub(start)
	r.metrics.observe(op, took, err)
	if err == nil || errors.Is(err, redis.Nil) || answered(err) {
		// Redis answered: an error it replied (a record that does not
		// decode, a script's refusal) is the record's, never a reason
		// to stop using Redis.
		r.deadline.observe(end, took)
		r.breaker.success()
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.deadline.observe(end, took) // at least the deadline it ran out of
	if r.breaker.failure(end, r.timeout) {
		r.metrics.breakerOpen()
		r.log.Warn("redis unreachable; admitting from this replica's share of each policy until it answers",
			"addr", r.addr, "op", op, "err", err, "deadline", limit, "replicas", r.replicas.Load(),
			"share", "rate and burst divided by the live replicas")
	}
	return fmt.Errorf("redis %s: %w", op, err)
}

// answered reports whether err is a reply Redis made (it is reachable),
// rather than a failure to reach it. Replies saying Redis cannot serve
// now (loading its data, busy, a replica that cannot write) are not.
func answered(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MISCONF", "NOAUTH", "WRONGPASS", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

// errDegraded is the error call returns while the breaker is open.
var errDegraded = errors.New("redis breaker open")

func (r *Store) run(ctx context.Context, op string, s *redis.Script, keys []string, args ...any) ([]any, error) {
	var out []any
	err := r.call(ctx, op, func(ctx context.Context) error {
		v, err := s.Run(ctx, r.client, keys, args...).Result()
		if err != nil {
			return err
		}
		if v == nil {
			return redis.Nil
		}
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("script %s returned %T; want an array", op, v)
		}
		out = arr
		return nil
	})
	return out, err
}

func ints(v []any) ([]int64, error) {
	out := make([]int64, len(v))
	for i, x := range v {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("reply element %d is %T; want an integer", i, x)
		}
		out[i] = n
	}
	return out, nil
}
