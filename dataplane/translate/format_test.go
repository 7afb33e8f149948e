package translate

import (
	"errors"
	"strings"
	"testing"
)

// formatFrame decodes a request with extra top-level fields and returns its frame.
func formatFrame(t *testing.T, extra string) (string, error) {
	t.Helper()
	req, err := DecodeRequest([]byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]` + extra + `}`))
	if err != nil {
		return "", err
	}
	turn, err := ToResponses(req, Options{})
	if err != nil {
		t.Fatal(err)
	}
	frame, err := turn.CreateFrame("", nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(frame), nil
}

// TestStructuredOutputFormat: output_config.format and the beta's output_format of type
// json_schema reach the backend as text.format with strict: true, the schema as strict mode
// takes it: every object closed and all its properties required (what the client's schema
// accepts too), annotations left out, key order kept (docs/translation.md §1.3).
func TestStructuredOutputFormat(t *testing.T) {
	// Claude Code 2.1.332's session-title request.
	const title = `{"type":"object","properties":{"title":{"type":"string"}},"required":["title"],"additionalProperties":false}`
	tests := []struct {
		name, extra, want string
	}{
		{"Claude Code's title, output_config.format",
			`,"output_config":{"effort":"low","format":{"type":"json_schema","schema":` + title + `}}`,
			`"text":{"format":{"type":"json_schema","name":"structured_output","schema":` + title + `,"strict":true}}`},
		{"the beta's output_format",
			`,"output_format":{"type":"json_schema","schema":` + title + `}`,
			`"text":{"format":{"type":"json_schema","name":"structured_output","schema":` + title + `,"strict":true}}`},
		{"a Vercel AI SDK schema: $schema, an optional property, a default, nested objects, $defs, a nullable",
			`,"output_config":{"format":{"type":"json_schema","schema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",` +
				`"properties":{"city":{"type":"string","description":"where"},"population":{"type":"integer","minimum":0},` +
				`"mayor":{"type":"object","properties":{"name":{"type":"string"},"since":{"type":"string","format":"date"}},"required":["name"]},` +
				`"tags":{"type":"array","items":{"type":"string","enum":["a","b"]},"default":[]},"home":{"$ref":"#/$defs/place"},` +
				`"note":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["city","tags"],"additionalProperties":false,` +
				`"$defs":{"place":{"type":"object","properties":{"lat":{"type":"number"}}}}}}}`,
			`"text":{"format":{"type":"json_schema","name":"structured_output","schema":{"type":"object",` +
				`"properties":{"city":{"type":"string","description":"where"},"population":{"type":"integer","minimum":0},` +
				`"mayor":{"type":"object","properties":{"name":{"type":"string"},"since":{"type":"string","format":"date"}},"required":["name","since"],"additionalProperties":false},` +
				`"tags":{"type":"array","items":{"type":"string","enum":["a","b"]}},"home":{"$ref":"#/$defs/place"},` +
				`"note":{"anyOf":[{"type":"string"},{"type":"null"}]}},` +
				`"$defs":{"place":{"type":"object","properties":{"lat":{"type":"number"}},"required":["lat"],"additionalProperties":false}},` +
				`"required":["city","population","mayor","tags","home","note"],"additionalProperties":false},"strict":true}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame, err := formatFrame(t, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(frame, `"reasoning":`) == strings.Contains(tt.extra, "effort") {
				t.Errorf("frame %s: effort and format must both be read", frame)
			}
			if !strings.Contains(frame, tt.want) {
				t.Errorf("frame\n%s\nwant it to contain\n%s", frame, tt.want)
			}
		})
	}
	frame, err := formatFrame(t, "")
	if err != nil || strings.Contains(frame, `"text":{`) {
		t.Errorf("frame without a format: %s (%v); want no text field", frame, err)
	}
}

// TestStructuredOutputFormatRefused: a schema strict mode cannot take, and that cannot be
// rewritten without changing what the client's schema accepts, is a 400 naming the keyword,
// never sent without it.
func TestStructuredOutputFormatRefused(t *testing.T) {
	format := func(schema string) string {
		return `,"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}`
	}
	tests := []struct {
		name, extra, field, msg string
	}{
		{"minLength", format(`{"type":"object","properties":{"a":{"type":"string","minLength":1}}}`),
			"output_config.format.schema.properties.a.minLength", `keyword "minLength" is not supported by the OpenAI backend's strict structured outputs; supported: type, properties,`},
		{"oneOf", format(`{"type":"object","properties":{"a":{"oneOf":[{"type":"string"},{"type":"number"}]}}}`),
			"output_config.format.schema.properties.a.oneOf", `keyword "oneOf" is not supported`},
		{"allOf", format(`{"type":"object","allOf":[{"type":"object"}]}`),
			"output_config.format.schema.allOf", `keyword "allOf" is not supported`},
		{"an open object", format(`{"type":"object","properties":{"m":{"type":"object","additionalProperties":{"type":"string"}}}}`),
			"output_config.format.schema.properties.m.additionalProperties", "must be false: the OpenAI backend's strict structured outputs take only closed objects"},
		{"format uri", format(`{"type":"object","properties":{"u":{"type":"string","format":"uri"}}}`),
			"output_config.format.schema.properties.u.format", `format "uri" is not supported by the OpenAI backend's strict structured outputs; supported: date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid`},
		{"a root that is not an object", format(`{"type":"array","items":{"type":"string"}}`),
			"output_config.format.schema.type", `the root of a schema must be "type": "object"`},
		{"a root anyOf", format(`{"type":"object","anyOf":[{"type":"object"}]}`),
			"output_config.format.schema.anyOf", "the root of a schema cannot be anyOf"},
		{"a required name without a property", format(`{"type":"object","properties":{"a":{"type":"string"}},"required":["a","b"]}`),
			"output_config.format.schema.required[1]", `"b" is required but not in properties`},
		{"tuple items", format(`{"type":"object","properties":{"p":{"type":"array","items":[{"type":"number"}]}}}`),
			"output_config.format.schema.properties.p.items", "must be one schema"},
		{"a boolean schema", format(`{"type":"object","properties":{"any":true}}`),
			"output_config.format.schema.properties.any", "must be a schema object, got a boolean"},
		{"another format type", `,"output_config":{"format":{"type":"json_object"}}`,
			"output_config.format.type", `format type "json_object" cannot be sent to the OpenAI backend; allowed: json_schema`},
		{"no schema", `,"output_format":{"type":"json_schema"}`,
			"output_format.schema", "field required for a json_schema format"},
		{"both fields", format(`{"type":"object"}`) + `,"output_format":{"type":"json_schema","schema":{"type":"object"}}`,
			"output_format", "send the schema once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := formatFrame(t, tt.extra)
			var re *RequestError
			if !errors.As(err, &re) || re.Field != tt.field || !strings.Contains(re.Message, tt.msg) {
				t.Fatalf("error %v, want a RequestError at %s containing %q", err, tt.field, tt.msg)
			}
		})
	}
}
