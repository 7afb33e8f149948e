package broker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/clodex/clodex/controlplane/store"
)

// KeySize is the credential key's length: 32 bytes, for AES-256-GCM.
const KeySize = 32

// Key is the credential key that seals tokens at rest. It formats as
// "[redacted]" everywhere.
type Key struct{ aead cipher.AEAD }

// String redacts the key.
func (Key) String() string { return "[redacted]" }

// GoString redacts the key.
func (Key) GoString() string { return "[redacted]" }

// ReadKeyFile reads the credential key: 32 random bytes, base64-encoded on
// one line, as `head -c 32 /dev/urandom | base64` writes them. The file
// must not be readable by group or others (chmod 600). Errors name the
// file and what is wrong; they never contain key material.
func ReadKeyFile(path string) (Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Key{}, fmt.Errorf("credential key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Key{}, fmt.Errorf("credential key file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return Key{}, fmt.Errorf("credential key file %s has mode %s: it is readable by group or others; chmod 600 it", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, fmt.Errorf("credential key file: %w", err)
	}
	k, err := ParseKey(string(b))
	if err != nil {
		return Key{}, fmt.Errorf("credential key file %s: %w", path, err)
	}
	return k, nil
}

// ParseKey decodes a base64-encoded 32-byte key (standard or URL alphabet,
// padded or not; surrounding whitespace is ignored).
func ParseKey(s string) (Key, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Key{}, errors.New("the key is empty; want 32 random bytes in base64 (head -c 32 /dev/urandom | base64)")
	}
	var raw []byte
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			raw = b
			break
		}
	}
	if raw == nil {
		return Key{}, errors.New("the key is not base64; want 32 random bytes in base64 (head -c 32 /dev/urandom | base64)")
	}
	if len(raw) != KeySize {
		return Key{}, fmt.Errorf("the key decodes to %d bytes; want exactly %d (head -c 32 /dev/urandom | base64)", len(raw), KeySize)
	}
	return newKey(raw)
}

func newKey(raw []byte) (Key, error) {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return Key{}, fmt.Errorf("credential key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return Key{}, fmt.Errorf("credential key: %w", err)
	}
	return Key{aead: aead}, nil
}

// GenerateKey returns a new random key and its base64 form (tests and
// tools).
func GenerateKey() (Key, string, error) {
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return Key{}, "", fmt.Errorf("generate credential key: %w", err)
	}
	k, err := newKey(raw)
	return k, base64.StdEncoding.EncodeToString(raw), err
}

// IsZero reports whether k holds no key.
func (k Key) IsZero() bool { return k.aead == nil }

// seal encrypts plain with AES-256-GCM under a fresh random nonce; the
// account key is authenticated with it, so a record moved to another
// account does not open.
func (k Key) seal(account string, plain []byte) []byte {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plain)+k.aead.Overhead())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails
	return k.aead.Seal(nonce, nonce, plain, []byte(account))
}

// errOpen is the one error of a sealed record that does not open.
var errOpen = errors.New("the sealed tokens do not open with this credential key (another --credential-key-file sealed them, or the record is damaged)")

// open decrypts what seal produced for account.
func (k Key) open(account string, sealed []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n+k.aead.Overhead() {
		return nil, errOpen
	}
	plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(account))
	if err != nil {
		return nil, errOpen
	}
	return plain, nil
}

// backupAD binds a sealed backup to its use: a backup does not open as a
// sign-in, nor a sign-in as a backup.
const backupAD = "clodex backup v1"

// errOpenBackup is the one error of a backup that does not open.
var errOpenBackup = errors.New("the backup does not open with this credential key (another --credential-key-file sealed it, or the file is damaged)")

// BackupSealer returns the sealer of backups under k (store.Sealer):
// AES-256-GCM with a fresh nonce per file, as the sign-ins are sealed.
func (k Key) BackupSealer() store.Sealer { return backupSealer{k: k} }

type backupSealer struct{ k Key }

func (s backupSealer) Seal(plain []byte) []byte { return s.k.seal(backupAD, plain) }

func (s backupSealer) Open(sealed []byte) ([]byte, error) {
	p, err := s.k.open(backupAD, sealed)
	if err != nil {
		return nil, errOpenBackup
	}
	return p, nil
}
