// Package account derives the opaque account key both planes use to name a
// ChatGPT account: "acct_" + the first 16 hex digits of SHA-256(account id).
//
//	key := account.Key(chatgptAccountID) // "acct_3c9b1f0e2a4d5c6b"
//	ok := account.IsKey(s)               // a well-formed key
//
// The key is what crosses process boundaries (Admit requests, the control
// plane's policy file, metrics labels, logs); the raw account id and any
// token never do (docs/credentials.md §2).
package account

import (
	"crypto/sha256"
	"encoding/hex"
)

// Prefix starts every key.
const Prefix = "acct_"

// KeyLen is the length of a key: the prefix plus 16 hex digits.
const KeyLen = len(Prefix) + 16

// Key returns the account key for a ChatGPT account id.
func Key(chatgptAccountID string) string {
	sum := sha256.Sum256([]byte(chatgptAccountID))
	var buf [KeyLen]byte
	copy(buf[:], Prefix)
	hex.Encode(buf[len(Prefix):], sum[:8])
	return string(buf[:])
}

// IsKey reports whether s has the shape of a key: the prefix followed by
// exactly 16 lowercase hex digits.
func IsKey(s string) bool {
	if len(s) != KeyLen || s[:len(Prefix)] != Prefix {
		return false
	}
	for i := len(Prefix); i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
