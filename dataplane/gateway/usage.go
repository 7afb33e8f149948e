package gateway

import (
	"context"
	"strings"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// UsageReporter takes each turn's usage for the control plane's ledger
// (docs/operations.md §16). The control-plane client (dataplane/control)
// implements it; ReportUsage must not block.
type UsageReporter interface {
	ReportUsage(u *controlplanev1.UsageRow)
}

// maxModelName bounds the model name a turn's usage is recorded under.
const maxModelName = 64

// usageModel is the requested model name as the ledger records it: lower
// case, without a date suffix ("claude-sonnet-4-5-20250929" is
// "claude-sonnet-4-5"), every byte other than a letter, a digit, '.',
// '-', '_', ':' or '/' replaced by '_', at most 64 bytes; "unknown" when
// empty. Any name a client sends thus costs the ledger one bounded row.
func usageModel(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if i := strings.LastIndexByte(name, '-'); i >= 0 && len(name)-i == 9 && allDigits(name[i+1:]) {
		name = name[:i]
	}
	if len(name) > maxModelName {
		name = name[:maxModelName]
	}
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte(".-_:/", c) >= 0) {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// reportUsage hands the turn's usage to Config.Usage: a turn that ran on
// an account (whatever its outcome), with the backend's token figures of
// its last attempt's response when it reported them, the new sockets it
// opened, and whether admission refused it in the end.
func (t *turnRun) reportUsage(ctx context.Context, outcome string) {
	u := t.s.cfg.Usage
	if u == nil || t.part.Account == "" {
		return
	}
	row := &controlplanev1.UsageRow{Member: memberOf(ctx), Account: t.part.Account, Model: usageModel(t.turn.RequestedModel),
		Turns: 1, NewSockets: int64(t.newSockets)}
	if t.stream != nil {
		if bu, ok := t.stream.BackendUsage(); ok {
			row.InputTokens = int64(bu.InputTokens + bu.CacheReadInputTokens + bu.CacheCreationInputTokens)
			row.CachedTokens = int64(bu.CacheReadInputTokens)
			row.OutputTokens = int64(bu.OutputTokens)
		}
	}
	if outcome != outcomeCompleted && t.refused {
		row.Refusals = 1
	}
	u.ReportUsage(row)
}
