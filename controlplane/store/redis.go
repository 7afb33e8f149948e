package store

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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/internal/pacing"
)

// Redis defaults.
const (
	// DefaultRedisTimeout is the hard deadline of one Redis call.
	DefaultRedisTimeout = 100 * time.Millisecond
	// DefaultBreakerFailures is how many consecutive failed Redis calls
	// open the breaker.
	DefaultBreakerFailures = 3
	// DefaultProbeEvery is how often an open breaker pings Redis.
	DefaultProbeEvery = 250 * time.Millisecond
	// DefaultPrefix prefixes every Redis key and channel.
	DefaultPrefix = "clodex:"
	// ReplicaTTL is how long a replica counts as live after its last
	// registration (it registers every RedisOptions.Tick).
	ReplicaTTL = 5 * time.Second
)

// RedisOptions configures OpenRedis. The zero value is not usable: URL is
// required.
type RedisOptions struct {
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
	// Timeout is the hard deadline of every Redis call. (Optional;
	// default 100ms)
	Timeout time.Duration
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
}

//go:embed lua/*.lua
var luaFS embed.FS

func mustScript(name string) *redis.Script {
	pre, err := luaFS.ReadFile("lua/prelude.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(pre) + "\n" + string(body))
}

var (
	scriptAdmit     = mustScript("admit")
	scriptCancel    = mustScript("cancel")
	scriptAccount   = mustScript("account")
	scriptUpdate    = mustScript("update")
	scriptReport403 = mustScript("report403")
	scriptAdapt     = mustScript("adapt")
	scriptHandOver  = mustScript("handover")
)

// Redis is the store shared by control-plane replicas. Every decision is
// one Lua script over one hash per account (with a time to live), the
// bucket math of internal/pacing mirrored in integers; policies live in
// one hash with a store-wide version, and every change is published so
// each replica can push it to its agents.
//
// Every Redis call has a hard deadline; consecutive failures open a
// breaker, and while it is open Admit answers from a local bucket holding
// this replica's share of the policy (rate and burst divided by the live
// replicas; empty when the outage starts, refilling at the share's rate),
// says so once, and hands its local grants over when Redis answers again. It is safe for concurrent use.
type Redis struct {
	client   redis.UniversalClient
	admits   *batcher // Admit's script calls, auto-pipelined
	addr     string   // for display: no credentials
	prefix   string
	channel  string
	defaults pacing.Policy
	defRec   string // the default record, version 0
	now      func() time.Time
	clock    *redisClock // nil when Options.Now is set
	timeout  time.Duration
	probe    time.Duration
	tick     time.Duration
	idleMs   int64
	replica  string
	log      *slog.Logger
	metrics  *redisMetrics

	// Admit's script arguments that never change, boxed once: the
	// policies key, the default record, the idle time (ms).
	admitPolicies, admitDefRec, admitIdle any

	breaker breaker
	local   *fallback
	cache   policyCache

	replicas atomic.Int64 // live replicas, as last read

	mu       sync.Mutex // guards the following field
	watchers []func(key string)
}

// OpenRedis connects to Redis and returns the store. A malformed URL or a
// Redis that refuses the credentials is an error; an unreachable one is
// not: the store starts degraded (admitting from its share, with the
// local clock until Redis answers) and says so.
func OpenRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	r := &Redis{
		prefix:   opts.Prefix,
		defaults: pacing.DefaultPolicy(),
		timeout:  opts.Timeout,
		probe:    opts.ProbeEvery,
		tick:     opts.Tick,
		replica:  opts.Replica,
		log:      opts.Logger,
	}
	if r.prefix == "" {
		r.prefix = DefaultPrefix
	}
	if opts.Defaults != nil {
		r.defaults = *opts.Defaults
	}
	if r.timeout <= 0 {
		r.timeout = DefaultRedisTimeout
	}
	if r.probe <= 0 {
		r.probe = DefaultProbeEvery
	}
	if r.tick <= 0 {
		r.tick = time.Second
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
	r.defRec = "0 " + encodeRecord(r.defaults, DefaultAdaptive)
	r.replicas.Store(1)

	client, addr, err := newRedisClient(opts.URL, r.timeout)
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
	r.admits = newBatcher(client, scriptAdmit, r.timeout)
	r.admitPolicies, r.admitDefRec, r.admitIdle = r.policiesKey(), r.defRec, r.idleMs
	if opts.Now != nil {
		r.now = opts.Now
	} else {
		r.clock = &redisClock{}
		r.now = r.clock.Now
	}
	r.local = newFallback(r.now)

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
	return r, nil
}

// newRedisClient builds the client for url and returns it with the
// address to display.
func newRedisClient(raw string, timeout time.Duration) (redis.UniversalClient, string, error) {
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

// CheckRedis proves the Redis at rawURL answers a PING within
// max(timeout, 1s) with the URL's credentials, as OpenRedis's first contact
// does; unlike OpenRedis, an unreachable Redis is an error. It keeps no
// connection.
func CheckRedis(ctx context.Context, rawURL string, timeout time.Duration) error {
	client, addr, err := newRedisClient(rawURL, timeout)
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
func (r *Redis) Close() error {
	r.admits.close()
	return r.client.Close()
}

// Now returns the store's clock: Redis's, unless RedisOptions.Now was set.
// The control plane decides every request on it.
func (r *Redis) Now() time.Time { return r.now() }

// Defaults returns the policy for accounts without a stored policy.
func (r *Redis) Defaults() pacing.Policy { return r.defaults }

// Replica returns this replica's id.
func (r *Redis) Replica() string { return r.replica }

// Info describes the store: kind "redis", the address without
// credentials, this replica and the live replica count.
func (r *Redis) Info() Info {
	return Info{Kind: "redis", Address: r.addr, Replica: r.replica, Replicas: int(r.replicas.Load()), Degraded: r.breaker.isOpen()}
}

// WatchPolicies registers fn to be called with the key whose policy or
// effective rate another replica changed, and with "" when notifications
// may have been missed (every key may have changed). fn runs on Run's
// goroutine and must not block.
func (r *Redis) WatchPolicies(fn func(key string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers = append(r.watchers, fn)
}

func (r *Redis) notify(key string) {
	r.mu.Lock()
	ws := append([]func(string){}, r.watchers...)
	r.mu.Unlock()
	for _, fn := range ws {
		fn(key)
	}
}

func (r *Redis) acctKey(key string) string { return r.prefix + "a:" + key }
func (r *Redis) policiesKey() string       { return r.prefix + "policies" }
func (r *Redis) versionKey() string        { return r.prefix + "version" }
func (r *Redis) adaptiveKey() string       { return r.prefix + "adaptive" }
func (r *Redis) replicasKey() string       { return r.prefix + "replicas" }
func (r *Redis) defaultsKey() string       { return r.prefix + "defaults" }

// micros is the instant the scripts use: microseconds since the epoch.
func micros(t time.Time) int64 { return t.UnixMicro() }

// call runs fn with the Redis deadline and keeps the breaker. It returns
// errDegraded without calling fn while the breaker is open. A failure the
// caller caused (its context ended) does not count against Redis.
func (r *Redis) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	if r.breaker.isOpen() {
		return errDegraded
	}
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	start := time.Now()
	err := fn(cctx)
	cancel()
	r.metrics.observe(op, time.Since(start), err)
	if err == nil || errors.Is(err, redis.Nil) {
		r.breaker.success()
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if r.breaker.failure() {
		r.metrics.breakerOpen()
		r.log.Warn("redis unreachable; admitting from this replica's share of each policy until it answers",
			"addr", r.addr, "op", op, "err", err, "timeout", r.timeout, "replicas", r.replicas.Load())
	}
	return fmt.Errorf("redis %s: %w", op, err)
}

// errDegraded is the error call returns while the breaker is open.
var errDegraded = errors.New("redis breaker open")

func (r *Redis) run(ctx context.Context, op string, s *redis.Script, keys []string, args ...any) ([]any, error) {
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

// Admit runs key's bucket once at now in one script; concurrent Admits
// share one pipeline per round trip. While Redis cannot be reached it
// decides from this replica's local share and never fails.
func (r *Redis) Admit(ctx context.Context, key string, now time.Time) (Admission, error) {
	var v []any
	err := r.call(ctx, "admit", func(ctx context.Context) error {
		reply, err := r.admits.run(ctx, r.admits.evalArgs(r.acctKey(key), r.admitPolicies, key, micros(now), r.admitDefRec, r.admitIdle))
		if err != nil {
			return err
		}
		arr, ok := reply.([]any)
		if !ok {
			return fmt.Errorf("script admit returned %T; want an array", reply)
		}
		v = arr
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Admission{}, ctx.Err()
		}
		r.metrics.fallback.Inc()
		a := r.local.admit(key, r.localPolicy(key), int(r.replicas.Load()), now)
		if sp, ok := r.cache.get(key); ok {
			a.PolicyVersion = sp.Version
		}
		return a, nil
	}
	var n [9]int64
	if len(v) != len(n) {
		return Admission{}, fmt.Errorf("admit: malformed script reply %v: %d elements; want %d", v, len(v), len(n))
	}
	for i, x := range v {
		var ok bool
		if n[i], ok = x.(int64); !ok {
			return Admission{}, fmt.Errorf("admit: malformed script reply %v: element %d is %T; want an integer", v, i, x)
		}
	}
	d := pacing.Decision{
		Kind:         pacing.Kind(n[0]),
		Wait:         time.Duration(n[1]) * time.Millisecond,
		RetryAfter:   time.Duration(n[2]) * time.Second,
		RequiredWait: time.Duration(n[3]) * time.Millisecond,
		Debited:      n[4] == 1,
		Relaxed:      n[5] == 1,
		ID:           uint64(n[6]),
	}
	return Admission{Decision: d, PolicyVersion: n[7], Reservation: uint64(n[8])}, nil
}

// Cancel refunds reservation id of key if it is still pending at now.
// Reservations made from the local share while Redis was unreachable are
// refunded locally.
func (r *Redis) Cancel(ctx context.Context, key string, id uint64, now time.Time) (bool, error) {
	if id == 0 {
		return false, nil
	}
	if isLocalReservation(id) {
		return r.local.cancel(key, id, now), nil
	}
	var ok int64
	err := r.call(ctx, "cancel", func(ctx context.Context) error {
		var err error
		ok, err = scriptCancel.Run(ctx, r.client, []string{r.acctKey(key)}, strconv.FormatUint(id, 10), micros(now)).Int64()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, nil // the reservation departs on its own; nothing is lost but one token
	}
	return ok == 1, nil
}

// HandOver debits grants made elsewhere (see HandOverResult). The report
// id is remembered in Redis for HandOverIdempotency.
func (r *Redis) HandOver(ctx context.Context, key string, grants int, reportID string, now time.Time) (HandOverResult, error) {
	grants = min(max(grants, 0), MaxHandOverGrants)
	v, err := r.run(ctx, "handover", scriptHandOver,
		[]string{r.acctKey(key), r.policiesKey(), r.prefix + "h:" + reportID + ":" + key},
		key, micros(now), r.defRec, r.idleMs, grants, HandOverIdempotency.Milliseconds())
	if err != nil {
		return HandOverResult{}, r.writeErr(ctx, "hand over", err)
	}
	if len(v) == 1 {
		return HandOverResult{Duplicate: true}, nil
	}
	if len(v) != 8 {
		return HandOverResult{}, fmt.Errorf("hand over: malformed script reply %v", v)
	}
	debited, _ := v[0].(int64)
	acct, err := r.snapshot(key, v[1:])
	if err != nil {
		return HandOverResult{}, fmt.Errorf("hand over: %w", err)
	}
	r.metrics.handover.Add(float64(debited))
	return HandOverResult{Debited: int(debited), Account: acct}, nil
}

// snapshot decodes a script snapshot: version, custom, units, effective
// rate, adaptive, record, the pause's end (us, 0: none).
func (r *Redis) snapshot(key string, v []any) (Account, error) {
	if len(v) != 7 {
		return Account{}, fmt.Errorf("snapshot has %d fields; want 7", len(v))
	}
	n, err := ints(v[:5])
	if err != nil {
		return Account{}, fmt.Errorf("snapshot: %w", err)
	}
	pu, ok := v[6].(int64)
	if !ok {
		return Account{}, fmt.Errorf("snapshot: the pause %v is not an integer", v[6])
	}
	rec, _ := v[5].(string)
	a := Account{
		Key:           key,
		Policy:        r.defaults,
		Tokens:        float64(n[2]) / float64(time.Minute),
		PolicyVersion: n[0],
		Custom:        n[1] == 1,
		EffectiveRate: int(n[3]),
		Adaptive:      n[4] == 1,
	}
	if pu > 0 {
		a.PausedUntil = time.UnixMicro(pu).UTC()
	}
	if rec != "" {
		sp, err := decodeRecord(rec)
		if err != nil {
			return Account{}, err
		}
		a.Policy = sp.policy()
		r.cache.put(key, sp)
	}
	return a, nil
}

// Account returns key's snapshot at now, or ErrNotFound. While Redis
// cannot be reached it answers from the last known policy and this
// replica's local share.
func (r *Redis) Account(ctx context.Context, key string, now time.Time) (Account, error) {
	v, err := r.run(ctx, "account", scriptAccount, []string{r.acctKey(key), r.policiesKey()},
		key, micros(now), r.defRec, r.idleMs)
	switch {
	case errors.Is(err, redis.Nil):
		return Account{}, ErrNotFound
	case err != nil && ctx.Err() != nil:
		return Account{}, ctx.Err()
	case err != nil:
		return r.localAccount(key, now)
	}
	return r.snapshot(key, v)
}

// localAccount is Account from the local share and the policy cache.
func (r *Redis) localAccount(key string, now time.Time) (Account, error) {
	sp, custom := r.cache.get(key)
	tokens, known := r.local.tokens(key, now)
	if !custom && !known {
		return Account{}, ErrNotFound
	}
	p := r.defaults
	a := Account{Key: key, Custom: custom, Adaptive: DefaultAdaptive}
	if custom {
		p = sp.policy()
		a.PolicyVersion, a.Adaptive = sp.Version, sp.Adaptive
	}
	a.Policy, a.EffectiveRate = p, p.RatePerMinute
	if !known {
		tokens = float64(share(p, int(r.replicas.Load())).Burst)
	}
	a.Tokens = tokens
	return a, nil
}

// localPolicy is the last known policy of key (its configured policy;
// adaptive lowering is not known locally).
func (r *Redis) localPolicy(key string) pacing.Policy {
	if sp, ok := r.cache.get(key); ok {
		return sp.policy()
	}
	return r.defaults
}

// Accounts returns every account with state or a stored policy, ordered
// by key. While Redis cannot be reached it lists the stored policies and
// the local share's accounts.
func (r *Redis) Accounts(ctx context.Context, now time.Time) ([]Account, error) {
	keys, err := r.accountKeys(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var out []Account
		for _, k := range r.local.keysWith(r.cache.keys()) {
			if a, err := r.localAccount(k, now); err == nil {
				out = append(out, a)
			}
		}
		sortAccounts(out)
		return out, nil
	}
	var out []Account
	const batch = 256
	for i := 0; i < len(keys); i += batch {
		chunk := keys[i:min(i+batch, len(keys))]
		var cmds []*redis.Cmd
		err := r.call(ctx, "accounts", func(ctx context.Context) error {
			pipe := r.client.Pipeline()
			cmds = make([]*redis.Cmd, len(chunk))
			for j, k := range chunk {
				cmds[j] = scriptAccount.EvalSha(ctx, pipe, []string{r.acctKey(k), r.policiesKey()}, k, micros(now), r.defRec, r.idleMs)
			}
			_, err := pipe.Exec(ctx)
			if err != nil && isNoScript(err) {
				if err := scriptAccount.Load(ctx, r.client).Err(); err != nil {
					return err
				}
				pipe = r.client.Pipeline()
				for j, k := range chunk {
					cmds[j] = scriptAccount.EvalSha(ctx, pipe, []string{r.acctKey(k), r.policiesKey()}, k, micros(now), r.defRec, r.idleMs)
				}
				_, err = pipe.Exec(ctx)
			}
			if errors.Is(err, redis.Nil) {
				return nil // some accounts expired between the scan and the read
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		for j, c := range cmds {
			v, err := c.Slice()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("list accounts: %w", err)
			}
			a, err := r.snapshot(chunk[j], v)
			if err != nil {
				return nil, fmt.Errorf("list accounts: %w", err)
			}
			out = append(out, a)
		}
	}
	sortAccounts(out)
	return out, nil
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// accountKeys returns every account key with state or a stored policy.
func (r *Redis) accountKeys(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	err := r.call(ctx, "policies", func(ctx context.Context) error {
		ks, err := r.client.HKeys(ctx, r.policiesKey()).Result()
		for _, k := range ks {
			seen[k] = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	prefix := r.acctKey("")
	var cursor uint64
	for {
		var ks []string
		err := r.call(ctx, "scan", func(ctx context.Context) error {
			var err error
			ks, cursor, err = r.client.Scan(ctx, cursor, prefix+"*", 1000).Result()
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, k := range ks {
			seen[strings.TrimPrefix(k, prefix)] = true
		}
		if cursor == 0 {
			break
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	return out, nil
}

// UpdatePolicy changes key's policy: update receives the current policy
// (the default one for an account without a stored policy) and returns
// the new one, or an error that UpdatePolicy returns unchanged. The change
// is one script (checked against the record update read, retried when
// another replica changed it in between) and is published to every
// replica. While Redis cannot be reached it fails with ErrUnavailable.
func (r *Redis) UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (Account, error) {
	return r.updateStored(ctx, key, now, func(sp storedPolicy) (storedPolicy, error) {
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

// SetAdaptive turns adaptive mode on or off for key (see Memory.SetAdaptive).
func (r *Redis) SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (Account, error) {
	return r.updateStored(ctx, key, now, func(sp storedPolicy) (storedPolicy, error) {
		sp.Adaptive = enabled
		return sp, nil
	})
}

func (r *Redis) updateStored(ctx context.Context, key string, now time.Time, update func(storedPolicy) (storedPolicy, error)) (Account, error) {
	for range 20 {
		var cur string
		err := r.call(ctx, "policy", func(ctx context.Context) error {
			var err error
			cur, err = r.client.HGet(ctx, r.policiesKey(), key).Result()
			return err
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return Account{}, r.writeErr(ctx, "update policy", err)
		}
		sp := newStoredPolicy(r.defaults, 0)
		if cur != "" {
			if sp, err = decodeRecord(cur); err != nil {
				return Account{}, fmt.Errorf("update policy: %w", err)
			}
		}
		next, err := update(sp)
		if err != nil {
			return Account{}, err
		}
		v, err := r.run(ctx, "update", scriptUpdate,
			[]string{r.acctKey(key), r.policiesKey(), r.versionKey(), r.adaptiveKey()},
			key, micros(now), r.defRec, r.idleMs, cur, encodeRecord(next.policy(), next.Adaptive), r.channel, r.replica)
		if err != nil {
			return Account{}, r.writeErr(ctx, "update policy", err)
		}
		if len(v) == 1 {
			continue // another replica changed the policy in between
		}
		return r.snapshot(key, v)
	}
	return Account{}, errors.New("update policy: the policy kept changing under concurrent updates; try again")
}

func (r *Redis) writeErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s: %w: redis %s unreachable (%v); admissions continue from each replica's share", op, ErrUnavailable, r.addr, err)
}

// Report403 records an upstream 403 for key at now with its retry-after
// (see Memory.Report403). While Redis cannot be reached the report is
// dropped (ErrNotFound).
func (r *Redis) Report403(ctx context.Context, key string, now time.Time, retryAfter time.Duration) (Account, bool, error) {
	v, err := r.run(ctx, "report403", scriptReport403, []string{r.acctKey(key), r.policiesKey(), r.adaptiveKey()},
		key, micros(now), r.defRec, r.idleMs, r.channel, r.replica, max(retryAfter, 0).Microseconds())
	switch {
	case errors.Is(err, redis.Nil):
		return Account{}, false, ErrNotFound
	case err != nil && ctx.Err() != nil:
		return Account{}, false, ctx.Err()
	case err != nil:
		return Account{}, false, ErrNotFound
	}
	if len(v) != 8 {
		return Account{}, false, fmt.Errorf("report 403: malformed script reply %v", v)
	}
	changed, _ := v[7].(int64)
	a, err := r.snapshot(key, v[:7])
	return a, changed == 1, err
}

// Adapt applies the adaptive raises due by now to the accounts in
// adaptive mode and returns those whose effective rate changed (each is
// also published). Every replica may run it: a raise is applied once.
func (r *Redis) Adapt(ctx context.Context, now time.Time) ([]Account, error) {
	var keys []string
	err := r.call(ctx, "adaptive", func(ctx context.Context) error {
		var err error
		keys, err = r.client.SMembers(ctx, r.adaptiveKey()).Result()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, nil
	}
	var out []Account
	for _, k := range keys {
		v, err := r.run(ctx, "adapt", scriptAdapt, []string{r.acctKey(k), r.policiesKey(), r.adaptiveKey()},
			k, micros(now), r.defRec, r.idleMs, r.channel, r.replica)
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return out, nil
		}
		a, err := r.snapshot(k, v)
		if err != nil {
			return nil, fmt.Errorf("adapt: %w", err)
		}
		out = append(out, a)
	}
	sortAccounts(out)
	return out, nil
}

// encodeRecord is a policy record without its version: "rate burst
// idle_ms total_ms retries bound_ms adaptive". The scripts read the
// resolved wait bound; Go re-derives it from the budget.
func encodeRecord(p pacing.Policy, adaptive bool) string {
	a := 0
	if adaptive {
		a = 1
	}
	b := p.Budget
	return fmt.Sprintf("%d %d %d %d %d %d %d", p.RatePerMinute, p.Burst, b.IdleTimeout.Milliseconds(),
		b.TotalTimeout.Milliseconds(), b.MaxRetries, b.WaitBound.Milliseconds(), a)
}

// decodeRecord parses a record with its version.
func decodeRecord(rec string) (storedPolicy, error) {
	f := strings.Fields(rec)
	if len(f) != 8 {
		return storedPolicy{}, fmt.Errorf("policy record %q has %d fields; want 8", rec, len(f))
	}
	var n [8]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return storedPolicy{}, fmt.Errorf("policy record %q: field %d is not an integer", rec, i+1)
		}
		n[i] = v
	}
	return storedPolicy{
		Version: n[0], RatePerMinute: int(n[1]), Burst: int(n[2]), IdleTimeoutMs: n[3],
		TotalTimeoutMs: n[4], MaxRetries: int(n[5]), Adaptive: n[7] == 1,
	}, nil
}
