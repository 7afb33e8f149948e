package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

// The store's epoch: a value written when the store is initialized. A
// replica remembers the epoch it serves under and reads the store's every
// tick (and before every durable write, inside the write's script): an
// epoch that is gone or changed means the store lost its data (a Redis
// restarted without persistence, a failover to an empty replica, a
// FLUSHALL), and the replica writes the durable state it holds back
// (heal.go).
//
// An epoch is "ID CREATED_MS" or, for one that replaced a lost one, "ID
// CREATED_MS from PARENT_ID".

func (r *Store) epochKey() string   { return r.prefix + "epoch" }
func (r *Store) healingKey() string { return r.prefix + "healing" }
func (r *Store) removedKey() string { return r.prefix + "removed" }

// newEpoch returns a new epoch value descending from parent ("" for none).
func newEpoch(parent string, now time.Time) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	e := hex.EncodeToString(b) + " " + strconv.FormatInt(now.UnixMilli(), 10)
	if id := epochID(parent); id != "" {
		e += " from " + id
	}
	return e
}

// epochID is the identifier of an epoch value.
func epochID(e string) string {
	id, _, _ := strings.Cut(e, " ")
	return id
}

// epochParent is the identifier of the epoch e replaced ("" for none).
func epochParent(e string) string {
	_, p, ok := strings.Cut(e, " from ")
	if !ok {
		return ""
	}
	return p
}

// epochState is what a replica knows of its store's epoch and losses.
type epochState struct {
	mu         sync.Mutex // guards the following fields
	known      string     // the epoch this replica serves under; "" before first contact
	lostAt     time.Time
	loss       string
	restoredAt time.Time
	restored   string
	healing    bool
	warnings   []string
}

func (r *Store) knownEpoch() string {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	return r.epoch.known
}

func (r *Store) adopt(e string) {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	r.epoch.known = e
}

// fillInfo adds the epoch facts to i.
func (r *Store) fillInfo(i *store.Info) {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	i.Epoch = epochID(r.epoch.known)
	i.LostAt, i.Loss = r.epoch.lostAt, r.epoch.loss
	i.RestoredAt, i.Restored = r.epoch.restoredAt, r.epoch.restored
	i.Healing = r.epoch.healing
	i.Warnings = append([]string(nil), r.epoch.warnings...)
}

// readEpoch returns the store's epoch ("" when there is none).
func (r *Store) readEpoch(ctx context.Context) (string, error) {
	var e string
	err := r.call(ctx, "epoch", func(ctx context.Context) error {
		v, err := r.client.Get(ctx, r.epochKey()).Result()
		e = v
		return err
	})
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return e, err
}

// setEpoch records e as the store's epoch unless another replica set one
// first, and returns the store's epoch.
func (r *Store) setEpoch(ctx context.Context, e string) (string, error) {
	var cur string
	err := r.call(ctx, "epoch", func(ctx context.Context) error {
		if err := r.client.SetNX(ctx, r.epochKey(), e, 0).Err(); err != nil {
			return err
		}
		v, err := r.client.Get(ctx, r.epochKey()).Result()
		cur = v
		return err
	})
	if err != nil {
		return "", fmt.Errorf("record the store's epoch: %w", err)
	}
	return cur, nil
}

// hasData reports whether the store holds durable records (one written
// by a clodex from before epochs, or one whose epoch alone was deleted).
func (r *Store) hasData(ctx context.Context) (bool, error) {
	var n int64
	err := r.call(ctx, "epoch", func(ctx context.Context) error {
		v, err := r.client.Exists(ctx, r.policiesKey(), r.loginsIndex(), r.agentCredsKey(), r.membersKey(), r.versionKey()).Result()
		n = v
		return err
	})
	return n > 0, err
}

// firstContact reads the store's epoch when this replica first reaches
// Redis (at Open, or when Redis first answers): it serves under the
// store's epoch, merging its newest backup when that backup is of this
// store; a store without an epoch but with data gets one; an empty store
// is restored from the newest backup, or else initialized as new, and
// says which. On an error the replica stays without an epoch and tries
// again at the next tick.
func (r *Store) firstContact(ctx context.Context) error {
	r.healMu.Lock()
	defer r.healMu.Unlock()
	if r.knownEpoch() != "" {
		return nil
	}
	cur, err := r.readEpoch(ctx)
	if err != nil {
		return err
	}
	if cur == "" {
		has, err := r.hasData(ctx)
		if err != nil {
			return err
		}
		if !has {
			return r.initEmpty(ctx)
		}
		if cur, err = r.setEpoch(ctx, newEpoch("", r.now())); err != nil {
			return err
		}
		r.log.Info("the store holds data but no epoch (a store written before epochs): recorded one", "epoch", epochID(cur))
	}
	r.adopt(cur)
	r.loadDurable(ctx)
	r.mergeBackup(ctx, cur)
	return nil
}

// initEmpty starts a store that holds nothing: from the newest backup
// when there is one (saying so), else as a new store (saying so too).
func (r *Store) initEmpty(ctx context.Context) error {
	snap, path, skipped, err := r.newestBackup()
	for _, s := range skipped {
		r.log.Error("a backup does not open; skipped", "backup", s)
	}
	if err != nil {
		e, serr := r.setEpoch(ctx, newEpoch("", r.now()))
		if serr != nil {
			return serr
		}
		r.adopt(e)
		why := "no --backup-dir"
		if r.backups != nil {
			why = err.Error()
		}
		r.log.Warn("redis holds no clodex data (no epoch) and there is no backup: starting a new, empty store; if policies or sign-ins were kept there, they are lost: restore a backup with clodexctl restore FILE",
			"addr", r.addr, "epoch", epochID(e), "backup", why)
		r.loadDurable(ctx)
		return nil
	}
	r.mergeSnapshot(snap)
	res, err := r.writeBack(ctx, r.restoreQuiet)
	if err != nil {
		return err
	}
	e, err := r.setEpoch(ctx, newEpoch(snap.Epoch, r.now()))
	if err != nil {
		return err
	}
	r.adopt(e)
	what := fmt.Sprintf("%s from backup %s written %s by replica %s", res, path, snap.Created.UTC().Format(time.RFC3339), snap.Replica)
	r.markRestored(what)
	r.log.Warn("redis held no clodex data (no epoch): restored the durable state from this replica's newest backup; refresh leases wait a while so replicas starting beside it can put newer copies back first",
		"addr", r.addr, "refresh_leases_wait", r.restoreQuiet, "backup", path, "written", snap.Created.UTC(), "by", snap.Replica, "restored", res.String(), "epoch", epochID(e))
	r.loadDurable(ctx)
	r.publishAll(ctx)
	return nil
}

// mergeBackup writes this replica's newest backup into a store that has
// an epoch, when the backup is of that store (its epoch, or the one it
// replaced): a replica restarting beside others may hold a newer copy of
// a record than the one restored. Every write is conditional, so the
// store keeps whatever it holds in a newer version.
func (r *Store) mergeBackup(ctx context.Context, cur string) {
	snap, path, _, err := r.newestBackup()
	if err != nil || snap.Epoch == "" {
		return
	}
	if id := epochID(snap.Epoch); id != epochID(cur) && id != epochParent(cur) {
		return
	}
	res, err := r.restoreSnapshot(ctx, snap, store.RestoreOptions{})
	if err != nil {
		r.log.Warn("merging this replica's newest backup into the store failed", "backup", path, "err", err)
		return
	}
	if res.Policies.Restored+res.Logins.Restored+res.AgentCreds.Restored+res.Members.Restored > 0 {
		r.markRestored(fmt.Sprintf("%s from backup %s", res, path))
		r.log.Warn("this replica's newest backup held records newer than the store's; put them back", "backup", path, "restored", res.String())
	}
}

// newestBackup returns the newest backup Options.Backup finds.
func (r *Store) newestBackup() (store.Snapshot, string, []string, error) {
	if r.backups == nil {
		return store.Snapshot{}, "", nil, store.ErrNoBackup
	}
	return r.backups()
}

// loadDurable reads the sign-ins, agent credentials and members into the
// ledger, so a replica holds a copy from its start.
func (r *Store) loadDurable(ctx context.Context) {
	if _, err := r.Logins(ctx); err != nil {
		r.log.Debug("load sign-ins", "err", err)
	}
	if _, err := r.AgentCreds(ctx); err != nil {
		r.log.Debug("load agent credentials", "err", err)
	}
	if _, err := r.Members(ctx); err != nil {
		r.log.Debug("load members", "err", err)
	}
	if _, err := r.KeyCanary(ctx); err != nil {
		r.log.Debug("load the key canary", "err", err)
	}
}

// checkEpoch compares the store's epoch with the one this replica serves
// under, and heals when it is gone or changed. It reports whether the
// store is intact.
func (r *Store) checkEpoch(ctx context.Context, cur string) bool {
	known := r.knownEpoch()
	if known == "" {
		if err := r.firstContact(ctx); err != nil {
			r.log.Warn("redis answers but the store's epoch could not be read; trying again", "err", err)
		}
		return false
	}
	if cur == known {
		return true
	}
	found := "it is gone"
	if cur != "" {
		found = "it changed to " + epochID(cur) + " (another replica found the loss first, or the store was initialized again)"
	}
	loss := fmt.Sprintf("the store's epoch %s was not found: %s; a Redis restarted without persistence, a failover to an empty replica or a FLUSHALL look like this", epochID(known), found)
	if err := r.heal(ctx, loss, false); err != nil && ctx.Err() == nil {
		r.log.Warn("writing the durable state back failed; trying again", "err", err)
	}
	return false
}

// markLost records a loss found now.
func (r *Store) markLost(loss string) {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	r.epoch.lostAt, r.epoch.loss, r.epoch.healing = time.Now(), loss, true
}

// markRestored records a restore finished now.
func (r *Store) markRestored(what string) {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	r.epoch.restoredAt, r.epoch.restored, r.epoch.healing = time.Now(), what, false
}

// setWarnings replaces the store's standing warnings.
func (r *Store) setWarnings(ws []string) {
	r.epoch.mu.Lock()
	defer r.epoch.mu.Unlock()
	r.epoch.warnings = ws
}
