package simauth

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTokenClaims(t *testing.T) {
	e := newEnv(t, Config{TokenTTL: 10 * time.Minute})
	tok := issue(t, e.a, "acct-claims")
	now := e.clock.Now().Unix()

	for _, tc := range []struct {
		name    string
		token   string
		wantAud string
	}{
		{"access", tok.AccessToken, "https://api.openai.com/v1"},
		{"id", tok.IDToken, "app_EMoamEEZ73f0CkXaXp7hrann"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := jwtPart(t, tc.token, 0)
			if h["alg"] != "HS256" || h["typ"] != "JWT" {
				t.Errorf("header = %v, want alg HS256 typ JWT", h)
			}
			c := jwtPart(t, tc.token, 1)
			if got := c["iss"]; got != "https://auth.openai.com" {
				t.Errorf("iss = %v, want https://auth.openai.com", got)
			}
			aud, _ := json.Marshal(c["aud"])
			if got, want := string(aud), `["`+tc.wantAud+`"]`; got != want {
				t.Errorf("aud = %s, want %s", got, want)
			}
			if got := c["iat"].(json.Number).String(); got != jsonInt(now) {
				t.Errorf("iat = %s, want %d", got, now)
			}
			if got := c["exp"].(json.Number).String(); got != jsonInt(now+600) {
				t.Errorf("exp = %s, want %d (iat + 10m)", got, now+600)
			}
			if got := c["email"]; got != "acct-claims@clodex-sim.invalid" {
				t.Errorf("email = %v", got)
			}
			sub, _ := c["sub"].(string)
			if sub == "" {
				t.Error("sub is empty")
			}
			if _, ok := c["chatgpt_account_id"]; ok {
				t.Error("token has a top-level chatgpt_account_id; real tokens carry it only in the nested claim")
			}
			auth, ok := c["https://api.openai.com/auth"].(map[string]any)
			if !ok {
				t.Fatalf("claim https://api.openai.com/auth missing: %v", c)
			}
			if auth["chatgpt_account_id"] != "acct-claims" || auth["chatgpt_plan_type"] != "pro" {
				t.Errorf("auth claim = %v, want chatgpt_account_id acct-claims, chatgpt_plan_type pro", auth)
			}
			if uid, _ := auth["chatgpt_user_id"].(string); uid == "" || uid != sub {
				t.Errorf("chatgpt_user_id = %v, want non-empty and equal to sub %q", auth["chatgpt_user_id"], sub)
			}
		})
	}
	if tok.ExpiresIn != 600 || tok.AccountID != "acct-claims" {
		t.Errorf("Tokens = %v, want ExpiresIn 600, AccountID acct-claims", tok)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestValidate(t *testing.T) {
	e := newEnv(t, Config{TokenTTL: time.Hour, Accept: map[string]string{"static-token": "acct-static"}})
	good := issue(t, e.a, "acct-v")
	foreign, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	foreignTok := issue(t, foreign, "acct-v")

	payload := jwtPart(t, good.AccessToken, 1)
	payload["https://api.openai.com/auth"].(map[string]any)["chatgpt_account_id"] = "acct-stolen"
	tampered := reencode(t, good.AccessToken, 1, payload)
	header := jwtPart(t, good.AccessToken, 0)
	header["alg"] = "none"
	algNone := strings.TrimSuffix(reencode(t, good.AccessToken, 0, header), "."+strings.Split(good.AccessToken, ".")[2]) + "."

	tests := []struct {
		name    string
		token   string
		advance time.Duration
		want    string
		wantErr error
	}{
		{name: "fresh access token", token: good.AccessToken, want: "acct-v"},
		{name: "one second before exp", token: good.AccessToken, advance: time.Hour - time.Second, want: "acct-v"},
		{name: "at exp", token: good.AccessToken, advance: time.Hour, wantErr: ErrExpired},
		{name: "long after exp", token: good.AccessToken, advance: 48 * time.Hour, wantErr: ErrExpired},
		{name: "configured token", token: "static-token", want: "acct-static"},
		{name: "configured token never expires", token: "static-token", advance: 1000 * time.Hour, want: "acct-static"},
		{name: "id token as bearer", token: good.IDToken, wantErr: ErrInvalid},
		{name: "tampered payload", token: tampered, wantErr: ErrInvalid},
		{name: "alg none", token: algNone, wantErr: ErrInvalid},
		{name: "signed by another authority", token: foreignTok.AccessToken, wantErr: ErrInvalid},
		{name: "refresh token as bearer", token: good.RefreshToken, wantErr: ErrInvalid},
		{name: "empty", token: "", wantErr: ErrInvalid},
		{name: "garbage", token: "a.b.c", wantErr: ErrInvalid},
		{name: "too many segments", token: good.AccessToken + ".x", wantErr: ErrInvalid},
		{name: "prefix of configured token", token: "static", wantErr: ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.clock.Set(tt.advance)
			got, err := e.a.Validate(tt.token)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Validate = %q, %v; want error %v", got, err, tt.wantErr)
				}
				if tt.token != "" && strings.Contains(err.Error(), tt.token) {
					t.Errorf("error %q contains the token", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Validate = %q, %v; want %q, nil", got, err, tt.want)
			}
		})
	}
}

func TestSetTokenTTL(t *testing.T) {
	e := newEnv(t, Config{})
	before := issue(t, e.a, "acct-ttl")
	e.a.SetTokenTTL(5 * time.Second)
	after := issue(t, e.a, "acct-ttl")
	if after.ExpiresIn != 5 {
		t.Errorf("ExpiresIn after SetTokenTTL(5s) = %d, want 5", after.ExpiresIn)
	}
	e.clock.Advance(5 * time.Second)
	if _, err := e.a.Validate(after.AccessToken); !errors.Is(err, ErrExpired) {
		t.Errorf("new token after 5s: err = %v, want ErrExpired", err)
	}
	if _, err := e.a.Validate(before.AccessToken); err != nil {
		t.Errorf("token issued before SetTokenTTL: err = %v, want nil (keeps its exp)", err)
	}
	// A refresh also uses the new lifetime.
	r := e.refresh(t, before.RefreshToken)
	if got, _ := r.body["expires_in"].(float64); got != 5 {
		t.Errorf("refresh expires_in = %v, want 5", r.body["expires_in"])
	}

	for _, tc := range []struct {
		in   time.Duration
		want int64
	}{{0, 3600}, {-time.Second, 3600}, {time.Millisecond, 1}, {90 * time.Second, 90}} {
		e.a.SetTokenTTL(tc.in)
		if got := issue(t, e.a, "acct-ttl").ExpiresIn; got != tc.want {
			t.Errorf("SetTokenTTL(%v): ExpiresIn = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestTokensRedacted(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	tok := issue(t, a, "acct-red")
	var sb strings.Builder
	for _, s := range []string{tok.String(), tok.GoString(), tok.LogValue().String()} {
		sb.WriteString(s)
	}
	out := sb.String()
	for _, secret := range []string{tok.AccessToken, tok.RefreshToken, tok.IDToken} {
		if strings.Contains(out, secret) {
			t.Fatalf("formatted Tokens contain a token: %s", out)
		}
	}
	if !strings.Contains(out, "acct-red") {
		t.Errorf("formatted Tokens %q do not name the account", out)
	}
}

func FuzzValidate(f *testing.F) {
	a, err := New(Config{Accept: map[string]string{"k": "acct"}})
	if err != nil {
		f.Fatal(err)
	}
	tok, err := a.Issue("acct-f")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{tok.AccessToken, tok.IDToken, tok.RefreshToken, "", "k", "a.b.c", "..", "e30.e30.", "eyJhbGciOiJIUzI1NiJ9.e30.AAAA"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		acct, err := a.Validate(s)
		switch {
		case err == nil && acct == "":
			t.Fatalf("Validate(%q) accepted with an empty account", s)
		case err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExpired):
			t.Fatalf("Validate(%q) error %v matches neither ErrInvalid nor ErrExpired", s, err)
		case err == nil && s != "k" && s != tok.AccessToken:
			t.Fatalf("Validate(%q) = %q, accepted a token it never issued", s, acct)
		}
	})
}

func BenchmarkValidate(b *testing.B) {
	a, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := a.Issue("acct-bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Validate(tok.AccessToken); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIssue(b *testing.B) {
	a, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Issue("acct-bench"); err != nil {
			b.Fatal(err)
		}
	}
}
