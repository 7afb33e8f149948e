package translate

import (
	"testing"
	"testing/quick"
)

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	cases := []string{"", "plain", "a\"b\\c", "\x00\x01\x1f\b\f\n\r\t\x7f", "é世界🎉", "\u2028\u2029", "<&>", "\xff\xfe bad", "a\xe2\x82"}
	check := func(s string) bool {
		want, err := marshalNoEscape(s)
		return err == nil && string(appendString(nil, s)) == string(want)
	}
	for _, c := range cases {
		if !check(c) {
			want, _ := marshalNoEscape(c)
			t.Errorf("appendString(%q) = %s, encoding/json %s", c, appendString(nil, c), want)
		}
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
	bytesCheck := func(b []byte) bool { return check(string(b)) }
	if err := quick.Check(bytesCheck, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
}
