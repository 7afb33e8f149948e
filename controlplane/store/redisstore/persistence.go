package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// persistenceWarning reads how Redis keeps its data across a restart
// (CONFIG GET appendonly and save) and returns a warning when it keeps
// none: every durable record, the sign-ins among them, lives there. A
// Redis that refuses CONFIG (a managed one) cannot be told: note says so.
func persistenceWarning(ctx context.Context, c redis.UniversalClient) (warning, note string, err error) {
	aof, err := c.ConfigGet(ctx, "appendonly").Result()
	if err != nil {
		return "", fmt.Sprintf("cannot tell whether redis persists its data (CONFIG GET refused: %v); make sure it runs with appendonly yes or RDB snapshots", err), nil
	}
	save, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		return "", "", fmt.Errorf("read redis persistence: %w", err)
	}
	if strings.EqualFold(aof["appendonly"], "yes") || strings.TrimSpace(save["save"]) != "" {
		return "", "", nil
	}
	return "redis keeps no copy of its data on disk (appendonly no, save \"\"): the policies, the sign-ins (refresh tokens) and the agent credentials live there, so a Redis restart empties it and only the replicas' memory and --backup-dir can put them back; run Redis with appendonly yes on a volume", "", nil
}

// checkPersistence records (and logs once) whether Redis persists its
// data.
func (r *Store) checkPersistence(ctx context.Context) {
	var warning, note string
	err := r.call(ctx, "config", func(ctx context.Context) error {
		var err error
		warning, note, err = persistenceWarning(ctx, r.client)
		return err
	})
	switch {
	case err != nil:
		r.log.Debug("read redis persistence", "err", err)
	case warning != "":
		r.log.Warn(warning, "addr", r.addr)
		r.setWarnings([]string{warning})
	case note != "":
		r.log.Info(note, "addr", r.addr)
		r.setWarnings(nil)
	default:
		r.setWarnings(nil)
	}
}

// Persistence reads how the Redis at rawURL keeps its data, as a start
// does (--check-config): a warning when it keeps no copy on disk, a note
// when it cannot be told. It keeps no connection.
func Persistence(ctx context.Context, rawURL string, timeout time.Duration) (warning, note string, err error) {
	client, addr, err := newClient(rawURL, timeout)
	if err != nil {
		return "", "", fmt.Errorf("check redis: %w", err)
	}
	defer func() { _ = client.Close() }()
	cctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	warning, note, err = persistenceWarning(cctx, client)
	if err != nil {
		return "", "", fmt.Errorf("check redis %s: %w", addr, err)
	}
	return warning, note, nil
}
