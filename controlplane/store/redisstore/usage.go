package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

// The usage ledger in Redis: one hash per minute and one per hour (what a
// long query reads), each row six fields named by its keys and a letter,
// incremented by one script per batch, and a key per applied batch for
// deduplication. Every key lives store.UsageRetention after its last
// write (an hour hash an hour more); nothing of it is written back after
// a loss (docs/operations.md §8).
var scriptUsage = mustPlainScript("usage")

// UsageRowsPerHour caps the distinct rows of one hour hash; past it rows
// fold into the other row, as a minute's past store.UsageRowsPerMinute.
const UsageRowsPerHour = 10 * store.UsageRowsPerMinute

// usageSep separates a field's parts: member, agent, account, model and
// the counter's letter (the keys are printable ASCII).
const usageSep = "\x1f"

// usageLetters name a row's six counters, in UsageCounts order.
const usageLetters = "ticosr"

// usageReadChunk is how many hashes one call of a query reads.
const usageReadChunk = 48

func (r *Store) usageMinuteKey(m int64) string {
	return r.prefix + "usage:m:" + strconv.FormatInt(m, 10)
}
func (r *Store) usageHourKey(h int64) string { return r.prefix + "usage:h:" + strconv.FormatInt(h, 10) }
func (r *Store) usageSeenKey(agent string, seq uint64) string {
	return r.prefix + "usage:seen:" + agent + ":" + strconv.FormatUint(seq, 10)
}

func usagePrefix(k store.UsageKey) string {
	return k.Member + usageSep + k.Agent + usageSep + k.Account + usageSep + k.Model + usageSep
}

// PutUsage applies batch b (see store.Memory.PutUsage) in one script:
// applied is false when Redis holds the batch's key already. While Redis
// cannot be reached it fails with store.ErrUnavailable and the data plane
// sends the batch again.
func (r *Store) PutUsage(ctx context.Context, b store.UsageBatch, now time.Time) (applied bool, err error) {
	oldest := now.Add(-store.UsageRetention)
	keys := []string{r.usageSeenKey(b.Agent, b.Seq)}
	index := map[int64]int{}
	args := []any{int64(store.UsageDedupWindow.Seconds()), int64((store.UsageRetention + time.Hour).Seconds()),
		store.UsageRowsPerMinute, UsageRowsPerHour, usagePrefix(store.UsageKey{Member: store.UsageOther, Agent: store.UsageOther,
			Account: store.UsageOther, Model: store.UsageOther})}
	for _, row := range b.Rows {
		if row.Minute.Before(oldest) {
			continue
		}
		m := row.Minute.Unix() / 60
		i, ok := index[m]
		if !ok {
			i = len(index) + 1
			index[m] = i
			keys = append(keys, r.usageMinuteKey(m), r.usageHourKey(m/60))
		}
		row.Agent = b.Agent
		args = append(args, i, usagePrefix(row.UsageKey), row.Turns, row.InputTokens, row.CachedTokens, row.OutputTokens,
			row.NewSockets, row.Refusals)
	}
	var n int64
	err = r.call(ctx, "usage", func(ctx context.Context) error {
		var err error
		n, err = scriptUsage.Run(ctx, r.client, keys, args...).Int64()
		return err
	})
	if err != nil {
		return false, r.writeErr(ctx, "put usage", err)
	}
	return n == 1, nil
}

// UsageRows calls fn with the ledger's rows of the minutes
// store.UsageMinutes names: the hour hashes of the whole hours among
// them, the minute hashes of the rest (a row of an hour hash has the
// hour's start as its minute). A field that does not decode is left out
// and reported once.
func (r *Store) UsageRows(ctx context.Context, since, until time.Time, fn func(store.UsageRow)) error {
	from, to := store.UsageMinutes(since, until)
	type span struct {
		key    string
		minute int64
	}
	var spans []span
	for m := from; m < to; {
		if m%60 == 0 && m+60 <= to {
			spans = append(spans, span{r.usageHourKey(m / 60), m})
			m += 60
			continue
		}
		spans = append(spans, span{r.usageMinuteKey(m), m})
		m++
	}
	for chunk := range slices.Chunk(spans, usageReadChunk) {
		var cmds []*redis.MapStringStringCmd
		err := r.call(ctx, "usage_read", func(ctx context.Context) error {
			pipe := r.client.Pipeline()
			cmds = make([]*redis.MapStringStringCmd, len(chunk))
			for i, s := range chunk {
				cmds[i] = pipe.HGetAll(ctx, s.key)
			}
			_, err := pipe.Exec(ctx)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("usage rows: %w: redis %s unreachable (%v)", store.ErrUnavailable, r.addr, err)
		}
		for i, s := range chunk {
			r.usageHash(s.key, time.Unix(s.minute*60, 0).UTC(), cmds[i].Val(), fn)
		}
	}
	return nil
}

// usageHash decodes one hash's fields into rows.
func (r *Store) usageHash(key string, minute time.Time, fields map[string]string, fn func(store.UsageRow)) {
	rows := map[store.UsageKey]*store.UsageCounts{}
	bad := 0
	for f, v := range fields {
		parts := strings.Split(f, usageSep)
		n, err := strconv.ParseInt(v, 10, 64)
		li := -1
		if len(parts) == 5 && len(parts[4]) == 1 {
			li = strings.IndexByte(usageLetters, parts[4][0])
		}
		if li < 0 || err != nil {
			bad++
			continue
		}
		k := store.UsageKey{Member: parts[0], Agent: parts[1], Account: parts[2], Model: parts[3]}
		c := rows[k]
		if c == nil {
			c = &store.UsageCounts{}
			rows[k] = c
		}
		*counter(c, li) += n
	}
	if bad > 0 {
		r.noteBad(&store.BadRecordError{Kind: "usage", Name: key, Where: "redis hash " + key,
			Err: errors.New(strconv.Itoa(bad) + " fields are not a usage row's counter; they are left out")})
	} else if len(fields) > 0 {
		r.noteGood("usage", key)
	}
	for k, c := range rows {
		fn(store.UsageRow{Minute: minute, UsageKey: k, UsageCounts: *c})
	}
}

// counter is c's counter named by usageLetters[i].
func counter(c *store.UsageCounts, i int) *int64 {
	switch i {
	case 0:
		return &c.Turns
	case 1:
		return &c.InputTokens
	case 2:
		return &c.CachedTokens
	case 3:
		return &c.OutputTokens
	case 4:
		return &c.NewSockets
	}
	return &c.Refusals
}
