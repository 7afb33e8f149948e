package pool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Partition identifies the heads a request may continue. Credentials are
// deliberately not part of it: an access-token refresh keeps the heads
// (call [Pool.DropAccount] when the backend rejects a socket's
// credentials). An empty Model or PromptCacheKey means unpartitioned: the
// request runs on a socket that never becomes a head.
type Partition struct {
	Account        string
	Model          string
	Effort         string
	PromptCacheKey string
}

func (p Partition) keyed() bool { return p.Model != "" && p.PromptCacheKey != "" }

// hash is the partition's diagnostic identity: the first 16 hex digits of
// SHA-256 over its fields joined with 0x1F. It reveals no account id.
func (p Partition) hash() string {
	h := sha256.New()
	for i, s := range []string{p.Account, p.Model, p.Effort, p.PromptCacheKey} {
		if i > 0 {
			h.Write([]byte{0x1f})
		}
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// digest identifies one canonical conversation item: SHA-256 truncated to
// 16 bytes. Heads keep digests, never items.
type digest [16]byte

func digestOf(item []byte) digest {
	s := sha256.Sum256(item)
	var d digest
	copy(d[:], s[:16])
	return d
}

func (d digest) short() string { return hex.EncodeToString(d[:8]) }

func digestAll(items [][]byte) []digest {
	out := make([]digest, len(items))
	for i, it := range items {
		out[i] = digestOf(it)
	}
	return out
}

// Match modes (docs/pool.md §3.2).
const (
	modeExact             = "exact"
	modeOmittedReasoning  = "omitted_reasoning"
	kindReasoning         = "reasoning"
	maxMismatchHeadsInLog = 16
)

// itemKind returns an item's "type", else its "role", else "". It decodes
// only those two top-level fields.
func itemKind(item []byte) string {
	var k struct {
		Type string `json:"type"`
		Role string `json:"role"`
	}
	if json.Unmarshal(item, &k) != nil {
		return ""
	}
	if k.Type != "" {
		return k.Type
	}
	return k.Role
}

func isReasoning(item []byte) bool {
	// Cheap pre-check before decoding: a reasoning item names its type.
	if !bytes.Contains(item, []byte(`"reasoning"`)) {
		return false
	}
	return itemKind(item) == kindReasoning
}

// match is the best candidate for a request.
type match struct {
	h       *head
	mode    string
	matched int // number of leading request items the head already holds
}

// matchHead reports whether h's conversation is a strict prefix of full,
// exactly or with its reasoning items omitted, and how many items matched.
func matchHead(h *head, full []digest) (mode string, matched int) {
	n := len(h.digests)
	if len(full) > n && equalDigests(h.digests, full[:n]) {
		return modeExact, n
	}
	if len(h.reasoning) == 0 {
		return "", 0
	}
	// requestInput ++ (expectedAssistant without reasoning items).
	m := n - len(h.reasoning)
	if len(full) <= m {
		return "", 0
	}
	ni := int(h.nInput)
	if !equalDigests(h.digests[:ni], full[:ni]) {
		return "", 0
	}
	j, r := ni, 0
	for i := ni; i < n; i++ {
		if r < len(h.reasoning) && int(h.reasoning[r]) == i {
			r++
			continue
		}
		if h.digests[i] != full[j] {
			return "", 0
		}
		j++
	}
	return modeOmittedReasoning, m
}

func equalDigests(a, b []digest) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
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
