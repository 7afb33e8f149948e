package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

func (r *Store) canaryKey() string { return r.prefix + "keycanary" }

// KeyCanary returns the credential key's sealed canary (broker.CheckKey),
// nil when the store has none; while Redis cannot be reached, this
// replica's copy.
func (r *Store) KeyCanary(ctx context.Context) ([]byte, error) {
	var v []byte
	err := r.call(ctx, "canary", func(ctx context.Context) error {
		b, err := r.client.Get(ctx, r.canaryKey()).Bytes()
		v = b
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		if c := r.ledger.keyCanary(); c != nil {
			// Lost with the store: this replica's copy goes back.
			r.noteLost("key canary", "credential key", r.canaryKey())
			return c, r.putCanary(ctx, c, false)
		}
		return nil, nil
	case err != nil && !answered(err) && r.ledger.keyCanary() != nil:
		return r.ledger.keyCanary(), nil
	case err != nil:
		return nil, fmt.Errorf("read the key canary: %w", err)
	}
	r.ledger.setCanary(v)
	return v, nil
}

// PutKeyCanary stores the sealed canary: only when there is none, unless
// replace is set.
func (r *Store) PutKeyCanary(ctx context.Context, sealed []byte, replace bool) error {
	return r.putCanary(ctx, sealed, replace)
}

func (r *Store) putCanary(ctx context.Context, sealed []byte, replace bool) error {
	var cur []byte
	err := r.call(ctx, "canary", func(ctx context.Context) error {
		var err error
		if replace {
			err = r.client.Set(ctx, r.canaryKey(), sealed, 0).Err()
		} else {
			err = r.client.SetNX(ctx, r.canaryKey(), sealed, 0).Err()
		}
		if err != nil {
			return err
		}
		cur, err = r.client.Get(ctx, r.canaryKey()).Bytes()
		return err
	})
	if err != nil {
		return fmt.Errorf("write the key canary: %w", err)
	}
	r.ledger.setCanary(cur)
	return nil
}

// KeyCanaryPlace names the canary's key.
func (r *Store) KeyCanaryPlace() string { return "redis key " + r.canaryKey() }

// ReadKeyCanary reads the key canary of the store at rawURL under prefix,
// as --check-config does (nil when there is none), and names its key. It
// keeps no connection and writes nothing.
func ReadKeyCanary(ctx context.Context, rawURL, prefix string, timeout time.Duration) (sealed []byte, place string, err error) {
	client, addr, err := newClient(rawURL, timeout)
	if err != nil {
		return nil, "", fmt.Errorf("check redis: %w", err)
	}
	defer func() { _ = client.Close() }()
	if prefix == "" {
		prefix = DefaultPrefix
	}
	cctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	b, err := client.Get(cctx, prefix+"keycanary").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, "redis key " + prefix + "keycanary", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("check redis %s: read the key canary: %w", addr, err)
	}
	return b, "redis key " + prefix + "keycanary", nil
}
