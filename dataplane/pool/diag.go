package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"
)

// maxMismatchHeadsInLog bounds the heads a miss's record describes.
const maxMismatchHeadsInLog = 16

// decisionRecord is one ws_head_decision line. It never holds conversation
// text, tokens or account ids: only hashes, counts and bounded ids.
type decisionRecord struct {
	Event                      string           `json:"event"`
	Time                       time.Time        `json:"time"`
	Decision                   string           `json:"decision"`
	Outcome                    string           `json:"outcome"`
	Generation                 string           `json:"generation,omitempty"`
	PartitionHash              string           `json:"partitionHash,omitempty"`
	AccountIDHash              string           `json:"accountIdHash"`
	Model                      string           `json:"model,omitempty"`
	Effort                     string           `json:"effort,omitempty"`
	InputCount                 int              `json:"inputCount"`
	IncrementalInputItems      int              `json:"incrementalInputItems"`
	CandidateCount             int              `json:"candidateCount"`
	IdleCandidateCount         int              `json:"idleCandidateCount"`
	MatchingCandidateCount     int              `json:"matchingCandidateCount"`
	ActiveConnectionCount      int              `json:"activeConnectionCount"`
	NurseryConnectionCount     int              `json:"nurseryConnectionCount"`
	EstablishedConnectionCount int              `json:"establishedConnectionCount"`
	MaxConnections             *int             `json:"maxConnections"`
	MaxNurseryConnections      *int             `json:"maxNurseryConnections"`
	SelectedConnectionID       uint64           `json:"selectedConnectionId,omitempty"`
	ContinuationMatchMode      string           `json:"continuationMatchMode,omitempty"`
	PromotedConnectionID       uint64           `json:"promotedConnectionId,omitempty"`
	CreatedConnectionID        uint64           `json:"createdConnectionId,omitempty"`
	RematchedAfterAdmission    bool             `json:"rematchedAfterAdmission,omitempty"`
	Rotation                   string           `json:"rotation,omitempty"`
	ReplaceReason              string           `json:"replaceReason,omitempty"`
	ReplacedConnectionID       uint64           `json:"replacedConnectionId,omitempty"`
	Heads                      []headRecord     `json:"heads,omitempty"`
	Evictions                  []evictionRecord `json:"evictions"`
}

type headRecord struct {
	ConnectionID  uint64          `json:"connectionId"`
	Generation    string          `json:"generation"`
	InFlight      bool            `json:"inFlight"`
	AgeMs         int64           `json:"ageMs"`
	PhysicalAgeMs int64           `json:"physicalAgeMs"`
	IdleMs        int64           `json:"idleMs"`
	Mismatch      *mismatchRecord `json:"mismatch,omitempty"`
}

type mismatchRecord struct {
	FullItems           int    `json:"fullItems"`
	ExpectedPrefixItems int    `json:"expectedPrefixItems"`
	FirstMismatch       int    `json:"firstMismatch"`
	ActualKind          string `json:"actualKind,omitempty"`
	ExpectedHash        string `json:"expectedHash,omitempty"`
	ActualHash          string `json:"actualHash,omitempty"`
}

type evictionRecord struct {
	ConnectionID  uint64 `json:"connectionId"`
	PartitionHash string `json:"partitionHash"`
	Generation    string `json:"generation"`
	Reason        string `json:"reason"`
}

// lostRecord is one ws_head_lost line: an idle head dropped because its
// socket closed, failed, sent a frame or stopped answering pings.
type lostRecord struct {
	Event                      string    `json:"event"`
	Time                       time.Time `json:"time"`
	Reason                     string    `json:"reason"`
	CloseCode                  int       `json:"closeCode,omitempty"`
	FrameType                  string    `json:"frameType,omitempty"`
	ConnectionID               uint64    `json:"connectionId"`
	PartitionHash              string    `json:"partitionHash"`
	Generation                 string    `json:"generation"`
	IdleMs                     int64     `json:"idleMs"`
	PhysicalAgeMs              int64     `json:"physicalAgeMs"`
	NurseryConnectionCount     int       `json:"nurseryConnectionCount"`
	EstablishedConnectionCount int       `json:"establishedConnectionCount"`
}

type descriptorRecord struct {
	Event           string    `json:"event"`
	Time            time.Time `json:"time"`
	Code            string    `json:"code"`
	DetectedBy      string    `json:"detectedBy"`
	HeldConnections int       `json:"heldConnections"`
	ShedConnections int       `json:"shedConnections"`
	Announced       bool      `json:"announced"`
}

// boundedID keeps an identifier only if it matches [A-Za-z0-9_.:/-]+,
// truncated to 128 bytes (docs/pool.md §11).
func boundedID(s string) string {
	if s == "" {
		return ""
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '/' || c == '-') {
			return ""
		}
	}
	if len(s) > 128 {
		s = s[:128]
	}
	return s
}

func hash16(s string) string {
	if s == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func capPtr(n int) *int {
	if n <= 0 {
		return nil
	}
	return &n
}

// newRecord starts a ws_head_decision record. The caller checks that
// diagnostics are on.
func (p *Pool) newRecord(part Partition, items [][]byte) *decisionRecord {
	rec := &decisionRecord{
		Event:                 "ws_head_decision",
		Time:                  p.now().UTC(),
		AccountIDHash:         hash16(part.Account),
		Model:                 boundedID(part.Model),
		Effort:                boundedID(part.Effort),
		InputCount:            len(items),
		IncrementalInputItems: len(items),
		MaxConnections:        capPtr(p.cfg.MaxConnections),
		MaxNurseryConnections: capPtr(p.cfg.MaxNurseryConnections),
		Evictions:             []evictionRecord{},
	}
	if part.keyed() {
		rec.PartitionHash = part.hash()
	}
	return rec
}

func (rec *decisionRecord) fillCountsLocked(p *Pool) {
	rec.ActiveConnectionCount = p.nBusy
	rec.NurseryConnectionCount = p.nNursery
	rec.EstablishedConnectionCount = p.nEstablish
}

// addCandidatesLocked records the heads of pt a request was matched
// against (matching is how many matched) and, on a miss, where each idle
// head diverged.
func (rec *decisionRecord) addCandidatesLocked(p *Pool, pt *partition, matching int, miss bool, full []digest, items [][]byte, now time.Time) {
	rec.CandidateCount = len(pt.heads)
	rec.MatchingCandidateCount = matching
	rec.IdleCandidateCount = 0
	for _, h := range pt.heads {
		if !h.busy {
			rec.IdleCandidateCount++
		}
	}
	if miss {
		rec.addMismatchesLocked(p, pt, full, items, now)
	}
}

// addMismatchesLocked records where each idle head of pt diverges from the
// request (bounded to maxMismatchHeadsInLog heads).
func (rec *decisionRecord) addMismatchesLocked(p *Pool, pt *partition, full []digest, items [][]byte, now time.Time) {
	rec.Heads = rec.Heads[:0]
	for _, h := range pt.heads {
		if len(rec.Heads) == maxMismatchHeadsInLog {
			break
		}
		hr := headRecord{
			ConnectionID:  h.id,
			Generation:    h.gen,
			InFlight:      h.busy,
			AgeMs:         (now.Sub(h.created) - h.ttlPaused).Milliseconds(),
			PhysicalAgeMs: now.Sub(h.created).Milliseconds(),
			IdleMs:        now.Sub(h.lastUsed).Milliseconds(),
		}
		if !h.busy && h.responseID != "" {
			i := firstMismatch(h, full)
			mm := &mismatchRecord{FullItems: len(full), ExpectedPrefixItems: len(h.digests), FirstMismatch: i}
			if i < len(h.digests) {
				mm.ExpectedHash = h.digests[i].short()
			}
			if i < len(full) {
				mm.ActualHash = full[i].short()
				mm.ActualKind = boundedID(itemKind(items[i]))
			}
			hr.Mismatch = mm
		}
		rec.Heads = append(rec.Heads, hr)
	}
	rec.fillCountsLocked(p)
}

// firstMismatch returns the first index where h's conversation and full
// differ (len of the shorter if one is a prefix of the other).
func firstMismatch(h *head, full []digest) int {
	n := min(len(h.digests), len(full))
	for i := range n {
		if h.digests[i] != full[i] {
			return i
		}
	}
	return n
}

func (d digest) short() string { return hex.EncodeToString(d[:8]) }

func outcomeOf(err error) string {
	switch {
	case errors.Is(err, ErrClosed):
		return "pool_closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

func (p *Pool) writeRecord(rec *decisionRecord) { p.writeJSON(rec) }

// writeReplacement writes the ws_head_decision record of a Replace. The
// caller checks that diagnostics are on.
func (p *Pool) writeReplacement(l *Lease, id uint64, reason, outcome string) {
	rec := &decisionRecord{
		Event:                 "ws_head_decision",
		Time:                  p.now().UTC(),
		Decision:              DecisionReplacement,
		Outcome:               outcome,
		AccountIDHash:         hash16(l.part.Account),
		Model:                 boundedID(l.part.Model),
		Effort:                boundedID(l.part.Effort),
		InputCount:            len(l.req),
		IncrementalInputItems: len(l.req),
		MaxConnections:        capPtr(p.cfg.MaxConnections),
		MaxNurseryConnections: capPtr(p.cfg.MaxNurseryConnections),
		CreatedConnectionID:   id,
		ReplaceReason:         metricLabel(reason),
		ReplacedConnectionID:  l.ConnectionID,
		Evictions:             []evictionRecord{},
		Generation:            GenerationIsolated,
	}
	if l.part.keyed() {
		rec.PartitionHash = l.part.hash()
		rec.Generation = GenerationNursery
	}
	p.mu.Lock()
	rec.fillCountsLocked(p)
	p.mu.Unlock()
	p.writeJSON(rec)
}

func (p *Pool) writeJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		p.cfg.Logger.Debug("encode diagnostic", "err", err)
		return
	}
	b = append(b, '\n')
	p.diagMu.Lock()
	_, err = p.cfg.Diagnostics.Write(b)
	p.diagMu.Unlock()
	if err != nil {
		p.cfg.Logger.Debug("write diagnostic", "err", err)
	}
}
