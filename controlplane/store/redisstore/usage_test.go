package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
)

// The ledger's keys in Redis live the retention after their last write
// (an hour hash an hour more), a batch's dedup key the dedup window; a
// field that is not a row's counter is left out and reported, and the
// rest of its hash still counts.
func TestUsageKeys(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	a := openReplica(t, rs, "u:", "cp-a", &Options{Now: (&fixedClock{t: t0}).Now})
	minute := t0.Truncate(time.Minute)
	b := store.UsageBatch{Agent: "h1", Seq: 7, Rows: []store.UsageRow{{Minute: minute,
		UsageKey:    store.UsageKey{Member: "alice", Account: key, Model: "claude-opus-4-1"},
		UsageCounts: store.UsageCounts{Turns: 2, InputTokens: 200, CachedTokens: 100, OutputTokens: 20, NewSockets: 1}}}}
	if applied, err := a.PutUsage(ctx, b, t0); err != nil || !applied {
		t.Fatalf("PutUsage = %v, %v; want applied", applied, err)
	}
	m := minute.Unix() / 60
	for _, k := range []struct {
		key string
		ttl time.Duration
	}{
		{a.usageMinuteKey(m), store.UsageRetention + time.Hour},
		{a.usageHourKey(m / 60), store.UsageRetention + time.Hour},
		{a.usageSeenKey("h1", 7), store.UsageDedupWindow},
	} {
		ttl, err := raw.TTL(ctx, k.key).Result()
		if err != nil || ttl <= k.ttl-time.Minute || ttl > k.ttl {
			t.Errorf("TTL %s = %v, %v; want about %v", k.key, ttl, err, k.ttl)
		}
	}

	// Garbage in the minute's hash: a field of no row, a counter that is
	// not a number.
	if err := raw.HSet(ctx, a.usageMinuteKey(m), "junk", "1", "bob\x1fh2\x1f"+key+"\x1fx\x1ft", "many").Err(); err != nil {
		t.Fatal(err)
	}
	var rows []store.UsageRow
	if err := a.UsageRows(ctx, minute, minute.Add(time.Minute), func(r store.UsageRow) { rows = append(rows, r) }); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Turns != 2 || rows[0].Agent != "h1" || rows[0].Member != "alice" {
		t.Errorf("rows with garbage beside them = %+v, want alice's one row of 2 turns", rows)
	}
	if !strings.Contains(a.log.String(), "a record in redis is unreadable") || !strings.Contains(a.log.String(), "usage") {
		t.Errorf("log lacks the unreadable usage record:\n%s", a.log.String())
	}
}
