package control

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Batches fit the agent stream: at most 200 rows and under its 32 KiB
// receive limit, even of the longest names; a minute's rows past 1000
// fold into one "other" row of the account; every turn is in one batch,
// in order of minute.
func TestUsageBatchesFitTheStream(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	c, err := New(Config{Target: "127.0.0.1:1", Token: testToken(t), AgentID: "h1-1-a", Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := account.Key("chatgpt-account-a")
	long := strings.Repeat("m", 70) // cut to 64
	const distinct = 1500
	for i := range distinct {
		c.ReportUsage(&controlplanev1.UsageRow{Member: fmt.Sprintf("%06d%s", i, long), Account: key,
			Model: "\x01" + long, InputTokens: 1 << 40, CachedTokens: 1 << 40, OutputTokens: 1 << 40, NewSockets: 9, Refusals: 1})
	}
	c.usageMu.Lock()
	c.cutUsageLocked(now)
	batches := c.usageBatches
	c.usageMu.Unlock()
	var turns, rows, other int64
	for i, b := range batches {
		msg := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Usage{Usage: b.report}}
		if n := proto.Size(msg); n > 32<<10 || len(b.report.GetRows()) > 200 {
			t.Errorf("batch %d: %d rows, %d bytes; want at most 200 rows and 32 KiB", i, len(b.report.GetRows()), n)
		}
		if b.report.GetSeq() != uint64(i+1) {
			t.Errorf("batch %d has seq %d, want %d", i, b.report.GetSeq(), i+1)
		}
		for _, r := range b.report.GetRows() {
			turns += r.GetTurns()
			rows++
			if len(r.GetMember()) > 64 || len(r.GetModel()) > 64 || strings.ContainsRune(r.GetModel(), '\x01') {
				t.Fatalf("row %v: names over 64 bytes or not printable", r)
			}
			if r.GetMember() == "other" {
				other += r.GetTurns()
				if r.GetAccount() != key || r.GetModel() != "other" {
					t.Errorf("the other row = %v; want the account kept, model other", r)
				}
			}
		}
	}
	if turns != distinct || rows != 1001 || other != distinct-1000 {
		t.Errorf("%d turns in %d rows (other: %d turns) in %d batches; want %d turns in 1001 rows, other %d",
			turns, rows, other, len(batches), distinct, distinct-1000)
	}
}

func testToken(t *testing.T) bearer.Token {
	t.Helper()
	tok, err := bearer.Parse("agent-token")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
