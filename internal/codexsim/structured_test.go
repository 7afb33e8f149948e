package codexsim

import (
	"encoding/json"
	"testing"
)

func TestMinimalInstance(t *testing.T) {
	tests := []struct {
		name, schema, want string
	}{
		{"Claude Code's session title",
			`{"type":"object","properties":{"title":{"type":"string"}},"required":["title"],"additionalProperties":false}`,
			`{"title":"clodex-sim"}`},
		{"required properties only, in the schema's order",
			`{"type":"object","properties":{"z":{"type":"integer","minimum":3},"skip":{"type":"string"},"a":{"type":"boolean"},"n":{"type":"number","exclusiveMinimum":0.5}},"required":["a","z","n"]}`,
			`{"z":3,"a":false,"n":1.5}`},
		{"arrays, enums, const, formats, nullable",
			`{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","enum":["red","blue"]},"minItems":2},` +
				`"kind":{"const":"fixed"},"when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"},` +
				`"note":{"type":["null","string"]},"maybe":{"anyOf":[{"type":"null"},{"type":"string"}]},"empty":{"type":"array","items":{"type":"number"}}},` +
				`"required":["tags","kind","when","id","note","maybe","empty"]}`,
			`{"tags":["red","red"],"kind":"fixed","when":"2026-01-01T00:00:00Z","id":"00000000-0000-4000-8000-000000000000","note":"clodex-sim","maybe":null,"empty":[]}`},
		{"references to $defs, definitions and the root",
			`{"type":"object","properties":{"home":{"$ref":"#/$defs/place"},"work":{"$ref":"#/definitions/place"},"parent":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},` +
				`"required":["home","work","parent"],"$defs":{"place":{"type":"object","properties":{"lat":{"type":"number","maximum":-1}},"required":["lat"]}},` +
				`"definitions":{"place":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`,
			`{"home":{"lat":-1},"work":{"city":"clodex-sim"},"parent":null}`},
		{"a required recursion ends at the depth bound",
			`{"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]}`,
			`{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":null}}}}}}}}}}}}}}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(minimalInstance(json.RawMessage(tt.schema)))
			if got != tt.want {
				t.Errorf("minimalInstance\n got %s\nwant %s", got, tt.want)
			}
			if !json.Valid([]byte(got)) {
				t.Errorf("%s is not JSON", got)
			}
		})
	}
}

// A response.create with a json_schema text.format is answered with a JSON instance of the
// schema, as the backend's strict mode answers: reply and call directives are not followed;
// reasoning still comes first. A format without a name is refused as the backend refuses it.
func TestStructuredOutputAnswer(t *testing.T) {
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	format := json.RawMessage(`{"format":{"type":"json_schema","name":"structured_output","strict":true,` +
		`"schema":{"type":"object","properties":{"title":{"type":"string"},"n":{"type":"integer"}},"required":["title","n"],"additionalProperties":false}}}`)
	send(t, c, create("name it\n#sim reasoning thinking about it\n#sim reply not json\n#sim call Bash {}", map[string]any{"text": format}))
	evs := readResponse(t, c)
	if got := joined(evs, "response.output_text.delta"); got != `{"title":"clodex-sim","n":0}` {
		t.Errorf("answer %q, want the schema's instance", got)
	}
	items := itemsOf(t, last(evs))
	if len(items) != 2 || items[0]["type"] != "reasoning" || items[1]["type"] != "message" {
		t.Errorf("output %v, want a reasoning item and the message, no call", items)
	}

	send(t, c, create("name it", map[string]any{"text": json.RawMessage(`{"format":{"type":"json_schema","schema":{"type":"object"}}}`)}))
	e := errorOf(t, readEvent(t, c))
	if e["param"] != "text.format.name" || e["code"] != "invalid_request_error" {
		t.Errorf("error %v, want invalid_request_error for text.format.name", e)
	}

	send(t, c, create("#sim reply plain", map[string]any{"text": json.RawMessage(`{"format":{"type":"text"},"verbosity":"low"}`)}))
	if got := joined(readResponse(t, c), "response.output_text.delta"); got != "plain" {
		t.Errorf("answer %q with a text format, want the reply directive's", got)
	}
}
