package accounts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
)

// jsonObject is a JSON object that keeps its members' order and raw values,
// so rewriting a few members of a file owned by another program (Codex CLI)
// leaves everything else as it was.
type jsonObject struct {
	keys []string
	vals map[string]json.RawMessage
}

// parseObject decodes a JSON object. Duplicate keys keep their first
// position and last value, as encoding/json does.
func parseObject(data []byte) (*jsonObject, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	o := &jsonObject{vals: make(map[string]json.RawMessage)}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("not a JSON object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, seen := o.vals[key]; !seen {
			o.keys = append(o.keys, key)
		}
		o.vals[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	return o, nil
}

// set replaces or appends a member.
func (o *jsonObject) set(key string, v json.RawMessage) {
	if _, ok := o.vals[key]; !ok {
		o.keys = append(o.keys, key)
	}
	o.vals[key] = v
}

// setString sets a member to a JSON string.
func (o *jsonObject) setString(key, s string) {
	b, _ := json.Marshal(s) // a string always marshals
	o.set(key, b)
}

// MarshalJSON writes the members in their original order.
func (o *jsonObject) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(o.vals[k])
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// rotatedTokens are the tokens a refresh wrote back.
type rotatedTokens struct {
	access, refresh, id codexauth.Secret // id may be empty: keep the file's
}

// updateAuthJSON returns the auth.json document data with its tokens
// replaced by t and last_refresh set to now. Every other member, at any
// level, is kept as it was. The token values are copied with Reveal: this is
// the one place they are persisted.
func updateAuthJSON(data []byte, t rotatedTokens, now time.Time) ([]byte, error) {
	top, err := parseObject(data)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	tokens := &jsonObject{vals: make(map[string]json.RawMessage)}
	if raw, ok := top.vals["tokens"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if tokens, err = parseObject(raw); err != nil {
			return nil, fmt.Errorf("decode tokens: %w", err)
		}
	}
	tokens.setString("access_token", t.access.Reveal())
	tokens.setString("refresh_token", t.refresh.Reveal())
	if t.id != "" {
		tokens.setString("id_token", t.id.Reveal())
	}
	tb, err := tokens.MarshalJSON()
	if err != nil {
		return nil, err
	}
	top.set("tokens", tb)
	top.setString("last_refresh", now.UTC().Format(time.RFC3339Nano))
	flat, err := top.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, flat, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
