package broker

import (
	"context"
	"errors"
	"fmt"
)

// The key canary: a known text sealed with the credential key and kept
// beside the sign-ins. A replica started with another key cannot open it,
// and refuses to start (and --check-config fails) naming the key file,
// instead of showing the accounts as ok and failing every refresh.

// canaryAD and canaryText are what the canary seals.
const (
	canaryAD   = "clodex key canary v1"
	canaryText = "the sign-ins of this store are sealed with this key"
)

// CanaryStore keeps the key canary. store.LoginFile and redisstore.Store
// implement it.
type CanaryStore interface {
	// KeyCanary returns the sealed canary, nil when there is none.
	KeyCanary(ctx context.Context) ([]byte, error)
	// PutKeyCanary stores the sealed canary: only when there is none,
	// unless replace is set.
	PutKeyCanary(ctx context.Context, sealed []byte, replace bool) error
	// KeyCanaryPlace names where the canary lives, for messages.
	KeyCanaryPlace() string
}

// ErrWrongKey reports a credential key that does not open the store's
// sign-ins.
var ErrWrongKey = errors.New("the credential key does not open the sign-ins this store holds")

// CheckKey checks that k is the key the store's sign-ins are sealed
// with: it opens the store's canary; a store without one gets it (unless
// readOnly, as for --check-config). keyFile names the key in errors.
func CheckKey(ctx context.Context, cs CanaryStore, k Key, keyFile string, readOnly bool) error {
	sealed, err := cs.KeyCanary(ctx)
	if err != nil {
		return fmt.Errorf("check the credential key: %w", err)
	}
	if sealed == nil {
		if readOnly {
			return nil
		}
		if err := cs.PutKeyCanary(ctx, k.seal(canaryAD, []byte(canaryText)), false); err != nil {
			return fmt.Errorf("record the credential key's canary: %w", err)
		}
		return CheckKey(ctx, cs, k, keyFile, true) // another replica may have put its own first
	}
	if plain, err := k.open(canaryAD, sealed); err != nil || string(plain) != canaryText {
		return fmt.Errorf("--credential-key-file %s: %w: they were sealed with another key (its canary, %s, does not open; or the canary is damaged); start every replica with the same key file, or rotate keys with --rotate-credential-key",
			keyFile, ErrWrongKey, cs.KeyCanaryPlace())
	}
	return nil
}

// RotateStore is what RotateKey needs: the logins, their leases and the
// canary.
type RotateStore interface {
	Logins
	CanaryStore
}

// RotateKey re-seals every sign-in from old to next, each under its
// refresh lease and without a refresh (the tokens stay the same), then
// the canary. A sign-in already sealed with next is left as it is, so an
// interrupted rotation can be run again. It returns how many it re-sealed.
func RotateKey(ctx context.Context, st RotateStore, old, next Key, oldFile string) (int, error) {
	if err := CheckKey(ctx, st, old, oldFile, true); err != nil {
		if sealed, cerr := st.KeyCanary(ctx); cerr != nil || sealed == nil {
			return 0, err
		} else if plain, oerr := next.open(canaryAD, sealed); oerr != nil || string(plain) != canaryText {
			return 0, err // neither key: the wrong old key
		}
		// The canary is already under next: a rotation that was
		// interrupted after it; re-seal what is left.
	}
	ls, err := st.Logins(ctx)
	if err != nil {
		return 0, fmt.Errorf("rotate the credential key: %w", err)
	}
	n := 0
	for _, l := range ls {
		if l.Unreadable != "" {
			return n, fmt.Errorf("rotate the credential key: sign-in of %s: %s", l.Key, l.Unreadable)
		}
		done, err := reseal(ctx, st, l.Key, old, next)
		if err != nil {
			return n, fmt.Errorf("rotate the credential key: sign-in of %s: %w", l.Key, err)
		}
		if done {
			n++
		}
	}
	if err := st.PutKeyCanary(ctx, next.seal(canaryAD, []byte(canaryText)), true); err != nil {
		return n, fmt.Errorf("rotate the credential key: the canary: %w", err)
	}
	return n, nil
}

// reseal re-seals one sign-in under its lease; false when it was already
// sealed with next.
func reseal(ctx context.Context, st RotateStore, key string, old, next Key) (bool, error) {
	lctx, cancel := context.WithTimeout(ctx, DefaultLeaseWait)
	lease, err := st.AcquireLease(lctx, key, DefaultLeaseTTL)
	cancel()
	if err != nil {
		return false, err
	}
	defer func() { _ = lease.Release() }()
	l, err := st.Login(ctx, key)
	if err != nil {
		return false, err
	}
	plain, err := old.open(key, l.Sealed)
	if err != nil {
		if _, nerr := next.open(key, l.Sealed); nerr == nil {
			return false, nil
		}
		return false, err
	}
	l.Sealed = next.seal(key, plain)
	clear(plain)
	if _, err := st.PutLogin(ctx, l, lease); err != nil {
		return false, err
	}
	return true, nil
}
