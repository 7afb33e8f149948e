package account

import "testing"

func TestKey(t *testing.T) {
	// Expected values are the first 16 hex digits of `printf ID | sha256sum`.
	tests := []struct {
		id   string
		want string
	}{
		{"abc", "acct_ba7816bf8f01cfea"},
		{"", "acct_e3b0c44298fc1c14"},
		{"user-123", "acct_fcdec6df4d44dbc6"},
	}
	for _, tt := range tests {
		if got := Key(tt.id); got != tt.want {
			t.Errorf("Key(%q) = %q, want %q", tt.id, got, tt.want)
		}
	}
}

func TestIsKey(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"acct_ba7816bf8f01cfea", true},
		{"acct_0000000000000000", true},
		{"acct_BA7816BF8F01CFEA", false}, // uppercase hex is not what Key produces
		{"acct_ba7816bf8f01cfe", false},  // 15 digits
		{"acct_ba7816bf8f01cfeaa", false},
		{"acct_ba7816bf8f01cfeg", false},
		{"acc_ba7816bf8f01cfeaa", false},
		{"", false},
		{"user-123", false},
	}
	for _, tt := range tests {
		if got := IsKey(tt.s); got != tt.want {
			t.Errorf("IsKey(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}

func TestKeyIsKey(t *testing.T) {
	for _, id := range []string{"a", "b", "some long account id with spaces", "\x00"} {
		if k := Key(id); !IsKey(k) {
			t.Errorf("IsKey(Key(%q)) = false for %q", id, k)
		}
	}
}

func BenchmarkKey(b *testing.B) {
	for b.Loop() {
		_ = Key("user-123")
	}
}
