package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// PolicyFile is the policy file's name inside the data directory.
const PolicyFile = "policy.json"

// fileFormat is the policy file's format number.
const fileFormat = 1

func policyPath(dir string) string { return filepath.Join(dir, PolicyFile) }

// policyFile is the on-disk form of every stored policy.
type policyFile struct {
	Format   int                     `json:"format"`
	Version  int64                   `json:"version"`
	Accounts map[string]storedPolicy `json:"accounts"`
}

// storedPolicy is one account's stored policy. The wait bound is derived
// from the budget on load, never stored.
type storedPolicy struct {
	Version        int64 `json:"version"`
	RatePerMinute  int   `json:"rate_per_minute"`
	Burst          int   `json:"burst"`
	IdleTimeoutMs  int64 `json:"idle_timeout_ms"`
	TotalTimeoutMs int64 `json:"total_timeout_ms"`
	MaxRetries     int   `json:"max_retries"`
	// Adaptive is adaptive mode; the effective rate is not stored (it
	// starts at the configured rate). Always written; a file without it
	// (written before adaptive mode was the default) reads DefaultAdaptive.
	Adaptive bool `json:"adaptive"`
}

// UnmarshalJSON reads a stored policy, rejecting unknown fields; a
// missing "adaptive" is DefaultAdaptive.
func (sp *storedPolicy) UnmarshalJSON(b []byte) error {
	type plain storedPolicy
	var v struct {
		plain
		Adaptive *bool `json:"adaptive"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*sp = storedPolicy(v.plain)
	sp.Adaptive = DefaultAdaptive
	if v.Adaptive != nil {
		sp.Adaptive = *v.Adaptive
	}
	return nil
}

func newStoredPolicy(p pacing.Policy, version int64) storedPolicy {
	return storedPolicy{
		Version:        version,
		RatePerMinute:  p.RatePerMinute,
		Burst:          p.Burst,
		IdleTimeoutMs:  p.Budget.IdleTimeout.Milliseconds(),
		TotalTimeoutMs: p.Budget.TotalTimeout.Milliseconds(),
		MaxRetries:     p.Budget.MaxRetries,
		Adaptive:       DefaultAdaptive,
	}
}

func (sp storedPolicy) policy() pacing.Policy {
	idle := time.Duration(sp.IdleTimeoutMs) * time.Millisecond
	total := time.Duration(sp.TotalTimeoutMs) * time.Millisecond
	retries := sp.MaxRetries
	b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	return pacing.Policy{RatePerMinute: sp.RatePerMinute, Burst: sp.Burst, Budget: b}
}

// loadPolicyFile reads and validates path; a missing file is empty. A
// file that does not decode is replaced by its last good copy when that
// one does (loadGood; the Recovery says so).
func loadPolicyFile(path string) (policyFile, *Recovery, error) {
	return loadGood(path, func(b []byte) (policyFile, error) { return parsePolicyFile(path, b) })
}

// parsePolicyFile decodes and validates policy.json's bytes (nil: a
// missing file, empty).
func parsePolicyFile(path string, b []byte) (policyFile, error) {
	if b == nil {
		return policyFile{Format: fileFormat, Accounts: map[string]storedPolicy{}}, nil
	}
	var f policyFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return policyFile{}, fmt.Errorf("parse policy file %s: %w", path, err)
	}
	if f.Format != fileFormat {
		return policyFile{}, fmt.Errorf("parse policy file %s: format %d is not supported; want %d", path, f.Format, fileFormat)
	}
	if f.Accounts == nil {
		f.Accounts = map[string]storedPolicy{}
	}
	var errs []error
	for key, sp := range f.Accounts {
		if err := ValidateKey(key); err != nil {
			errs = append(errs, err)
			continue
		}
		const maxMs = math.MaxInt64 / int64(time.Millisecond)
		if sp.IdleTimeoutMs > maxMs || sp.IdleTimeoutMs < -maxMs || sp.TotalTimeoutMs > maxMs || sp.TotalTimeoutMs < -maxMs {
			errs = append(errs, fmt.Errorf("account %s: idle_timeout_ms %d or total_timeout_ms %d is out of range; allowed 10000..3600000 and 10000..%d",
				key, sp.IdleTimeoutMs, sp.TotalTimeoutMs, maxMs))
			continue
		}
		p := pacing.Policy{
			RatePerMinute: sp.RatePerMinute,
			Burst:         sp.Burst,
			Budget: pacing.Budget{
				IdleTimeout:  time.Duration(sp.IdleTimeoutMs) * time.Millisecond,
				TotalTimeout: time.Duration(sp.TotalTimeoutMs) * time.Millisecond,
				MaxRetries:   sp.MaxRetries,
			},
		}
		if err := p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("account %s: %w", key, err))
		} else if r := sp.policy().Budget; r.IdleTimeout != p.Budget.IdleTimeout || r.TotalTimeout != p.Budget.TotalTimeout || r.MaxRetries != p.Budget.MaxRetries {
			errs = append(errs, fmt.Errorf("account %s: budget idle_timeout_ms=%d total_timeout_ms=%d max_retries=%d is inconsistent (the budget rules would change it); fix it or remove the account",
				key, sp.IdleTimeoutMs, sp.TotalTimeoutMs, sp.MaxRetries))
		}
		if sp.Version < 1 || sp.Version > f.Version {
			errs = append(errs, fmt.Errorf("account %s: version %d is out of range; allowed 1..%d", key, sp.Version, f.Version))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return policyFile{}, fmt.Errorf("policy file %s: %w", path, err)
	}
	return f, nil
}

// writePolicyFile writes f to path atomically (see atomicfile.WriteFile),
// with mode 0600, and then its last good copy.
func writePolicyFile(path string, f policyFile) error {
	f.Format = fileFormat
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode policy file: %w", err)
	}
	if err := writeGood(path, append(b, '\n')); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	return nil
}
