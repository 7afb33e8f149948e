package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Snapshot is a store's durable state: what a backup holds, what a
// replica writes back after its store lost data, and what a restore puts
// back. Buckets, adaptive learning, live agents and plan usage are not
// in it: they rebuild by themselves (docs/operations.md §8).
type Snapshot struct {
	// Created is when the snapshot was taken.
	Created time.Time `json:"created"`
	// Kind is the store's kind ("memory" or "redis") and Replica the
	// replica that took it.
	Kind    string `json:"kind"`
	Replica string `json:"replica,omitempty"`
	// Epoch is the store's epoch when the snapshot was taken (Redis).
	Epoch string `json:"epoch,omitempty"`
	// Version is the highest store-wide policy version the snapshot's
	// taker had seen.
	Version int64 `json:"version"`
	// Policies are the stored policies, by account key (with their
	// budgets and adaptive settings).
	Policies map[string]PolicyRecord `json:"policies"`
	// Logins are the credential broker's sign-ins (sealed), by account
	// key.
	Logins map[string]Login `json:"logins"`
	// AgentCreds are the scoped agent credentials (digests), by name.
	AgentCreds map[string]AgentCred `json:"agent_credentials"`
	// Members are the team's members (key digests), by name.
	Members map[string]Member `json:"members,omitempty"`
	// Removed are the removals a restore must not undo: "login:KEY",
	// "cred:NAME" or "member:NAME" to the version of the record removed.
	Removed map[string]int64 `json:"removed,omitempty"`
	// KeyCanary is the credential key's sealed canary (the broker's), so
	// a store restored from the snapshot still refuses another key.
	KeyCanary []byte `json:"key_canary,omitempty"`
}

// PolicyRecord is one account's stored policy in a snapshot: the
// configured policy, its adaptive setting and the store-wide version at
// which it last changed. The wait bound is derived from the budget.
type PolicyRecord struct {
	Version        int64 `json:"version"`
	RatePerMinute  int   `json:"rate_per_minute"`
	Burst          int   `json:"burst"`
	IdleTimeoutMs  int64 `json:"idle_timeout_ms"`
	TotalTimeoutMs int64 `json:"total_timeout_ms"`
	MaxRetries     int   `json:"max_retries"`
	Adaptive       bool  `json:"adaptive"`
}

// NewPolicyRecord is p with its adaptive setting at version.
func NewPolicyRecord(p pacing.Policy, adaptive bool, version int64) PolicyRecord {
	sp := newStoredPolicy(p, version)
	sp.Adaptive = adaptive
	return PolicyRecord(sp)
}

// Policy is the record's configured policy, its wait bound derived.
func (p PolicyRecord) Policy() pacing.Policy { return storedPolicy(p).policy() }

// Validate checks the record is one a store could have written.
func (p PolicyRecord) Validate() error {
	pol := pacing.Policy{RatePerMinute: p.RatePerMinute, Burst: p.Burst, Budget: pacing.Budget{
		IdleTimeout:  time.Duration(p.IdleTimeoutMs) * time.Millisecond,
		TotalTimeout: time.Duration(p.TotalTimeoutMs) * time.Millisecond,
		MaxRetries:   p.MaxRetries,
	}}
	if p.Version < 1 {
		return fmt.Errorf("version %d is out of range; want 1 or more", p.Version)
	}
	if p.IdleTimeoutMs > maxMs || p.IdleTimeoutMs < 0 || p.TotalTimeoutMs > maxMs || p.TotalTimeoutMs < 0 {
		return fmt.Errorf("idle_timeout_ms %d or total_timeout_ms %d is out of range", p.IdleTimeoutMs, p.TotalTimeoutMs)
	}
	return pol.Validate()
}

// maxMs is the most milliseconds a time.Duration holds.
const maxMs = int64(1<<63-1) / int64(time.Millisecond)

// RestoreOptions says how a restore treats records the store holds in a
// newer version.
type RestoreOptions struct {
	// Force writes every record of the snapshot, each as a new change,
	// even over a newer one.
	Force bool
}

// RestoreCount counts the records of one kind a restore handled:
// Restored were written, Kept were not (the store holds the same or a
// newer version, or removed the record later).
type RestoreCount struct {
	Restored, Kept int
}

// RestoreResult is what a restore did.
type RestoreResult struct {
	Policies, Logins, AgentCreds, Members RestoreCount
}

// String says what a restore did, for logs.
func (r RestoreResult) String() string {
	return fmt.Sprintf("policies %d, sign-ins %d, agent credentials %d, members %d written back (%d, %d, %d and %d kept: the store's were as new or newer)",
		r.Policies.Restored, r.Logins.Restored, r.AgentCreds.Restored, r.Members.Restored,
		r.Policies.Kept, r.Logins.Kept, r.AgentCreds.Kept, r.Members.Kept)
}

// Sealer seals backups at rest (the credential broker's key: AES-256-GCM
// with a fresh nonce per seal).
type Sealer interface {
	Seal(plain []byte) []byte
	Open(sealed []byte) ([]byte, error)
}

// Backup file forms: a sealed backup starts with sealedMagic; a plain one
// is the snapshot's JSON.
const (
	sealedMagic   = "clodex-backup sealed v1\n"
	backupFormat  = 1
	maxBackupSize = 64 << 20
)

// backupDoc is a backup file's JSON.
type backupDoc struct {
	Format int `json:"format"`
	Snapshot
}

// EncodeBackup returns the backup file of s: its JSON, sealed with sealer
// when one is given (nil: plain, for a control plane without a
// credential key, whose snapshots hold no sign-ins).
func EncodeBackup(s Snapshot, sealer Sealer) ([]byte, error) {
	b, err := json.Marshal(backupDoc{Format: backupFormat, Snapshot: s.normalized()})
	if err != nil {
		return nil, fmt.Errorf("encode backup: %w", err)
	}
	if sealer == nil {
		return append(b, '\n'), nil
	}
	return append([]byte(sealedMagic), sealer.Seal(b)...), nil
}

// IsSealedBackup reports whether b is a sealed backup file.
func IsSealedBackup(b []byte) bool { return bytes.HasPrefix(b, []byte(sealedMagic)) }

// ErrNotBackup reports bytes that are not a backup file.
var ErrNotBackup = errors.New("not a clodex backup file")

// DecodeBackup reads a backup file, opening it with sealer when it is
// sealed, and checks every record. Errors name what is wrong, never a
// token.
func DecodeBackup(b []byte, sealer Sealer) (Snapshot, error) {
	if len(b) > maxBackupSize {
		return Snapshot{}, fmt.Errorf("decode backup: %d bytes; a backup holds at most %d", len(b), maxBackupSize)
	}
	if IsSealedBackup(b) {
		if sealer == nil {
			return Snapshot{}, errors.New("decode backup: the file is sealed with a credential key and this control plane has none (--credential-key-file)")
		}
		plain, err := sealer.Open(b[len(sealedMagic):])
		if err != nil {
			return Snapshot{}, fmt.Errorf("decode backup: %w", err)
		}
		b = plain
	} else if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return Snapshot{}, fmt.Errorf("decode backup: %w: want a file clodexctl backup or --backup-dir wrote", ErrNotBackup)
	}
	var d backupDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Snapshot{}, fmt.Errorf("decode backup: %w: %v", ErrNotBackup, err)
	}
	if d.Format != backupFormat {
		return Snapshot{}, fmt.Errorf("decode backup: format %d is not supported; want %d", d.Format, backupFormat)
	}
	s := d.normalized()
	if err := s.validate(); err != nil {
		return Snapshot{}, fmt.Errorf("decode backup: %w", err)
	}
	return s, nil
}

// normalized fills the maps and the records' names.
func (s Snapshot) normalized() Snapshot {
	s.Policies = maps.Clone(s.Policies)
	if s.Policies == nil {
		s.Policies = map[string]PolicyRecord{}
	}
	logins := make(map[string]Login, len(s.Logins))
	for k, l := range s.Logins {
		l.Key = k
		logins[k] = l
	}
	s.Logins = logins
	creds := make(map[string]AgentCred, len(s.AgentCreds))
	for n, c := range s.AgentCreds {
		c.Name = n
		creds[n] = c
	}
	s.AgentCreds = creds
	members := make(map[string]Member, len(s.Members))
	for n, m := range s.Members {
		m.Name = n
		members[n] = m
	}
	s.Members = members
	s.Removed = maps.Clone(s.Removed)
	if s.Removed == nil {
		s.Removed = map[string]int64{}
	}
	return s
}

func (s Snapshot) validate() error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(s.Policies)) {
		if err := ValidateKey(k); err != nil {
			errs = append(errs, fmt.Errorf("policy: %w", err))
		} else if err := s.Policies[k].Validate(); err != nil {
			errs = append(errs, fmt.Errorf("policy of %s: %w", k, err))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Logins)) {
		l := s.Logins[k]
		if err := ValidateKey(k); err != nil {
			errs = append(errs, fmt.Errorf("sign-in: %w", err))
		} else if l.Generation < 1 || len(l.Sealed) == 0 {
			errs = append(errs, fmt.Errorf("sign-in of %s: generation %d or its sealed tokens are missing", k, l.Generation))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(s.AgentCreds)) {
		c := s.AgentCreds[n]
		if n == "" || len(c.Digest) != 32 || len(c.Accounts) == 0 {
			errs = append(errs, fmt.Errorf("agent credential %q: want a name, a 32-byte digest and accounts", n))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(s.Members)) {
		m := s.Members[n]
		if err := m.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("member %q: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
