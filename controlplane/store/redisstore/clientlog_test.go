package redisstore

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// go-redis's lines become structured WARN records, the first at once and
// then one per ClientLogEvery carrying how many were left out.
func TestClientLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := newClientLog(slog.New(slog.NewJSONHandler(&buf, nil)), func() time.Time { return now })
	const dialFailure = "redis: connection pool: failed to dial after %d attempts: %v"
	for range 120 { // 30 s of an outage at four lines a second
		c.Printf(context.Background(), dialFailure, 5, "dial tcp 127.0.0.1:6379: connect: connection refused")
		now = now.Add(250 * time.Millisecond)
	}
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q is not a JSON record: %v", line, err)
		}
		recs = append(recs, r)
	}
	// At 0 s, 10 s and 20 s: three records for 120 lines.
	if len(recs) != 3 {
		t.Fatalf("%d records for 120 lines over 30 s; want 3 (one per 10 s):\n%s", len(recs), buf.String())
	}
	for i, r := range recs {
		if r["level"] != "WARN" || r["msg"] != "redis client" ||
			r["detail"] != "connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:6379: connect: connection refused" {
			t.Errorf("record %d = %v; want WARN \"redis client\" with the line as detail", i, r)
		}
	}
	if _, ok := recs[0]["suppressed"]; ok {
		t.Errorf("the first record says lines were suppressed: %v", recs[0])
	}
	if recs[1]["suppressed"] != 39.0 || recs[2]["suppressed"] != 39.0 {
		t.Errorf("suppressed = %v, %v; want 39 each (40 lines a 10 s window, one logged)", recs[1]["suppressed"], recs[2]["suppressed"])
	}
}
