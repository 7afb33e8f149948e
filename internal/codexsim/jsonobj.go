package codexsim

import (
	"encoding/json"
	"strconv"

	"github.com/clodex/clodex/internal/jsonstr"
)

// obj is a JSON object that keeps its keys in order, so events start with
// "type" as the real backend's do. It encodes without reflection.
type obj []field

type field struct {
	k string
	v any
}

// set replaces the value of key k, or appends it.
func (o obj) set(k string, v any) obj {
	for i := range o {
		if o[i].k == k {
			o[i].v = v
			return o
		}
	}
	return append(o, field{k, v})
}

// MarshalJSON implements json.Marshaler.
func (o obj) MarshalJSON() ([]byte, error) { return appendJSON(nil, o), nil }

// appendJSON appends the JSON encoding of v to b. It handles the types the
// emulator builds events from and falls back to encoding/json for others.
func appendJSON(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return jsonstr.Append(b, v)
	case bool:
		return strconv.AppendBool(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case obj:
		b = append(b, '{')
		for i, f := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, f.k)
			b = append(b, ':')
			b = appendJSON(b, f.v)
		}
		return append(b, '}')
	case []obj:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, e)
		}
		return append(b, ']')
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, e)
		}
		return append(b, ']')
	default:
		enc, err := json.Marshal(v)
		if err != nil {
			return append(b, "null"...)
		}
		return append(b, enc...)
	}
}
