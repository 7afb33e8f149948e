package redisstore

import (
	"errors"
	"strings"

	"github.com/clodex/clodex/controlplane/store"
)

// Records that do not decode affect only themselves: every reader turns
// one into a *store.BadRecordError (or an entry marked unreadable in a
// list), logs it once until it is readable again, and keeps serving the
// rest; Redis answered, so the breaker stays closed (call).

// noteBad logs an unreadable record once (until noteGood) and counts it.
func (r *Store) noteBad(e *store.BadRecordError) {
	if _, seen := r.noted.LoadOrStore("bad "+e.Kind+":"+e.Name, struct{}{}); seen {
		return
	}
	r.metrics.badRecords.WithLabelValues(strings.ReplaceAll(strings.ReplaceAll(e.Kind, "-", "_"), " ", "_")).Inc()
	r.log.Error("a record in redis is unreadable; it affects only itself", "kind", e.Kind, "name", e.Name, "key", e.Where, "err", e.Err)
}

// noteGood forgets that a record was unreadable.
func (r *Store) noteGood(kind, name string) { r.noted.Delete("bad " + kind + ":" + name) }

// badPolicy is the error of key's unreadable policy record.
func (r *Store) badPolicy(key string, err error) *store.BadRecordError {
	return &store.BadRecordError{Kind: "policy", Name: key, Where: "redis hash " + r.policiesKey() + " field " + key, Err: scriptCause(err)}
}

// scriptCause is the part of a script error that says what is wrong
// ("malformed policy record ..."), without Redis's framing, at most 120
// bytes.
func scriptCause(err error) error {
	msg := err.Error()
	i := strings.Index(msg, "clodex: ")
	if i < 0 {
		return err
	}
	msg = msg[i+len("clodex: "):]
	if j := strings.Index(msg, " script: "); j >= 0 {
		msg = msg[:j]
	}
	if len(msg) > 120 {
		msg = msg[:120] + "..."
	}
	return errors.New(msg)
}

func (r *Store) noteBadPolicy(key string, err error) { r.noteBad(r.badPolicy(key, err)) }

// noteLost logs, once until found again, a record this replica holds that
// the store lost, and asks Run to check the store.
func (r *Store) noteLost(kind, name, where string) {
	r.suspect()
	if _, seen := r.noted.LoadOrStore("lost "+kind+":"+name, struct{}{}); seen {
		return
	}
	r.log.Error("a record this replica holds is missing from redis (or older there); writing this replica's copy back", "kind", kind, "name", name, "key", where)
}

// noteFound forgets that a record was lost.
func (r *Store) noteFound(kind, name string) { r.noted.Delete("lost " + kind + ":" + name) }

// isBadPolicyReply reports a script error about a policy record that does
// not decode (prelude.lua's decode).
func isBadPolicyReply(err error) bool {
	return err != nil && strings.Contains(err.Error(), "clodex: malformed policy record")
}

// isBadStateReply reports a script error about an account's bucket state
// that does not decode (prelude.lua's load), or a key of the wrong type.
func isBadStateReply(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "clodex: malformed account state") || strings.HasPrefix(err.Error(), "WRONGTYPE"))
}
