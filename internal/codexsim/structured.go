package codexsim

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Structured outputs: a response.create whose text.format is a json_schema
// is answered with a minimal JSON instance of the schema (docs/emulator.md
// §6), as the backend's strict mode answers with JSON the schema accepts.

// textFormat reads text.format of a frame's text object: the schema of a
// json_schema format (nil for another format or none). A json_schema
// format without a name or a schema object is refused as the backend
// refuses it.
func textFormat(text json.RawMessage) (json.RawMessage, *wireError) {
	if isNull(text) {
		return nil, nil
	}
	var t struct {
		Format json.RawMessage `json:"format"`
	}
	if json.Unmarshal(text, &t) != nil || isNull(t.Format) {
		return nil, nil
	}
	var f struct {
		Type   string          `json:"type"`
		Name   json.RawMessage `json:"name"`
		Schema json.RawMessage `json:"schema"`
	}
	if err := json.Unmarshal(t.Format, &f); err != nil {
		return nil, invalidRequest("invalid_type", "text.format", "'text.format' is %s; want an object such as {\"type\":\"json_schema\",\"name\":…,\"schema\":{…}}", jsonKind(t.Format))
	}
	if f.Type != "json_schema" {
		return nil, nil
	}
	var name string
	if json.Unmarshal(f.Name, &name) != nil || name == "" {
		return nil, invalidRequest("", "text.format.name", "missing required parameter 'text.format.name'; want a name such as \"output\"")
	}
	if isNull(f.Schema) || bytes.TrimSpace(f.Schema)[0] != '{' {
		return nil, invalidRequest("", "text.format.schema", "'text.format.schema' is %s; want a JSON schema object", jsonKind(f.Schema))
	}
	return f.Schema, nil
}

// maxInstanceDepth bounds the $ref chain an instance follows: a recursive
// schema whose recursion is required would otherwise never end.
const maxInstanceDepth = 32

// minimalInstance returns a small JSON value the schema accepts: an
// object's required properties in the schema's order, an array's minItems
// items, a string "clodex-sim" (or a value of its format), a number at its
// minimum (else 0), false, null; const and enum give their (first) value,
// anyOf its first alternative, a $ref its target in the root's $defs or
// definitions.
func minimalInstance(schema json.RawMessage) []byte {
	return appendInstance(nil, schema, schema, 0)
}

func appendInstance(b []byte, root, schema json.RawMessage, depth int) []byte {
	var s map[string]json.RawMessage
	if json.Unmarshal(schema, &s) != nil || depth > maxInstanceDepth {
		return append(b, "null"...)
	}
	if c, ok := s["const"]; ok {
		return append(b, compactRaw(c)...)
	}
	var enum []json.RawMessage
	if json.Unmarshal(s["enum"], &enum) == nil && len(enum) > 0 {
		return append(b, compactRaw(enum[0])...)
	}
	var alts []json.RawMessage
	if json.Unmarshal(s["anyOf"], &alts) == nil && len(alts) > 0 {
		return appendInstance(b, root, alts[0], depth+1)
	}
	var ref string
	if json.Unmarshal(s["$ref"], &ref) == nil {
		return appendInstance(b, root, resolveRef(root, ref), depth+1)
	}
	switch schemaType(s) {
	case "object":
		var required []string
		_ = json.Unmarshal(s["required"], &required)
		var props map[string]json.RawMessage
		_ = json.Unmarshal(s["properties"], &props)
		b = append(b, '{')
		n := 0
		for _, k := range objectKeys(s["properties"]) {
			if !slices.Contains(required, k) {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendInstance(b, root, props[k], depth+1)
			n++
		}
		return append(b, '}')
	case "array":
		var count float64
		_ = json.Unmarshal(s["minItems"], &count)
		b = append(b, '[')
		for i := 0; i < int(min(count, 100)); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendInstance(b, root, s["items"], depth+1)
		}
		return append(b, ']')
	case "string":
		var format string
		_ = json.Unmarshal(s["format"], &format)
		return appendString(b, formatSample(format))
	case "integer", "number":
		return strconv.AppendFloat(b, numberSample(s, schemaType(s) == "integer"), 'f', -1, 64)
	case "boolean":
		return append(b, "false"...)
	}
	return append(b, "null"...)
}

// schemaType is the schema's type: the first of a list that is not null;
// without a type, object when it has properties, array when it has items.
func schemaType(s map[string]json.RawMessage) string {
	var t string
	if json.Unmarshal(s["type"], &t) == nil {
		return t
	}
	var list []string
	if json.Unmarshal(s["type"], &list) == nil {
		for _, t := range list {
			if t != "null" {
				return t
			}
		}
		return "null"
	}
	switch {
	case s["properties"] != nil:
		return "object"
	case s["items"] != nil:
		return "array"
	}
	return ""
}

// resolveRef finds a local reference ("#", "#/$defs/X", "#/definitions/X")
// in root; nil when it is none of those.
func resolveRef(root json.RawMessage, ref string) json.RawMessage {
	if ref == "#" {
		return root
	}
	var r map[string]json.RawMessage
	if json.Unmarshal(root, &r) != nil {
		return nil
	}
	for _, kw := range []string{"$defs", "definitions"} {
		if name, ok := strings.CutPrefix(ref, "#/"+kw+"/"); ok {
			var defs map[string]json.RawMessage
			if json.Unmarshal(r[kw], &defs) == nil {
				return defs[name]
			}
		}
	}
	return nil
}

// formatSample is a string of the format.
func formatSample(format string) string {
	switch format {
	case "date-time":
		return "2026-01-01T00:00:00Z"
	case "date":
		return "2026-01-01"
	case "time":
		return "00:00:00Z"
	case "duration":
		return "PT0S"
	case "email":
		return "sim@example.com"
	case "hostname":
		return "example.com"
	case "ipv4":
		return "127.0.0.1"
	case "ipv6":
		return "::1"
	case "uuid":
		return "00000000-0000-4000-8000-000000000000"
	case "uri":
		return "https://example.com/"
	}
	return "clodex-sim"
}

// numberSample is 0, or the schema's lower bound when 0 is below it, or
// its upper bound when 0 is above it (an integer rounded into the range).
func numberSample(s map[string]json.RawMessage, integer bool) float64 {
	v := 0.0
	var lo, hi float64
	if json.Unmarshal(s["minimum"], &lo) == nil && v < lo {
		v = lo
	}
	if json.Unmarshal(s["exclusiveMinimum"], &lo) == nil && v <= lo {
		v = lo + 1
	}
	if json.Unmarshal(s["maximum"], &hi) == nil && v > hi {
		v = hi
	}
	if json.Unmarshal(s["exclusiveMaximum"], &hi) == nil && v >= hi {
		v = hi - 1
	}
	if integer {
		v = math.Ceil(v)
	}
	return v
}

// objectKeys returns the keys of a JSON object in their order.
func objectKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return keys
		}
		k, _ := t.(string)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return keys
		}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

func compactRaw(r json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, r) != nil {
		return []byte("null")
	}
	return b.Bytes()
}
