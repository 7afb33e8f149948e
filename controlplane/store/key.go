package store

import "fmt"

// MaxKeyLen is the longest account key the store accepts.
const MaxKeyLen = 128

// ValidateKey checks an account key is usable: 1..128 bytes of printable
// ASCII without spaces. Keys are otherwise opaque to the store; data planes
// and clodexctl derive them with internal/account.Key.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("account key is empty; want an account key such as acct_0123456789abcdef")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("account key is %d bytes; allowed 1..%d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("account key %q has a byte 0x%02x at %d; allowed printable ASCII without spaces", key, c, i)
		}
	}
	return nil
}
