package translate

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeRequestErrors(t *testing.T) {
	const ok = `"model":"m","max_tokens":5`
	tests := []struct {
		name, body, field, msg string
	}{
		{"not JSON", `{"model":`, "", "Invalid JSON body"},
		{"empty", ``, "", "Invalid JSON body"},
		{"array body", `[]`, "", "must be a JSON object"},
		{"missing model", `{"max_tokens":1,"messages":[]}`, "model", "field required"},
		{"null model", `{"model":null,"max_tokens":1,"messages":[]}`, "model", "field required"},
		{"model number", `{"model":3,"max_tokens":1,"messages":[]}`, "model", "must be a string, got a number"},
		{"empty model", `{"model":"","max_tokens":1,"messages":[]}`, "model", "non-empty"},
		{"missing max_tokens", `{"model":"m","messages":[]}`, "max_tokens", "field required"},
		{"max_tokens string", `{"model":"m","max_tokens":"5","messages":[]}`, "max_tokens", "must be an integer, got a string"},
		{"max_tokens fraction", `{"model":"m","max_tokens":1.5,"messages":[]}`, "max_tokens", "must be an integer"},
		{"max_tokens zero", `{"model":"m","max_tokens":0,"messages":[]}`, "max_tokens", "at least 1"},
		{"max_tokens huge", `{"model":"m","max_tokens":1e300,"messages":[]}`, "max_tokens", "must be an integer"},
		{"missing messages", `{` + ok + `}`, "messages", "field required"},
		{"messages object", `{` + ok + `,"messages":{}}`, "messages", "must be an array, got an object"},
		{"message not object", `{` + ok + `,"messages":["hi"]}`, "messages[0]", "must be an object"},
		{"bad role", `{` + ok + `,"messages":[{"role":"tool","content":"x"}]}`, "messages[0].role", "allowed: user, assistant, system"},
		{"missing content", `{` + ok + `,"messages":[{"role":"user"}]}`, "messages[0].content", "field required"},
		{"content number", `{` + ok + `,"messages":[{"role":"user","content":1}]}`, "messages[0].content", "must be a string or an array"},
		{"block without type", `{` + ok + `,"messages":[{"role":"user","content":[{"text":"x"}]}]}`, "messages[0].content[0].type", "field required"},
		{"text not string", `{` + ok + `,"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"ok"},{"type":"text","text":7}]}]}`, "messages[1].content[1].text", "must be a string"},
		{"image without source", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"image"}]}]}`, "messages[0].content[0].source", "field required"},
		{"base64 without data", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png"}}]}]}`, "messages[0].content[0].source.data", "field required"},
		{"tool_use without id", `{` + ok + `,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"x","input":{}}]}]}`, "messages[0].content[0].id", "field required"},
		{"tool_use input array", `{` + ok + `,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"i","name":"x","input":[]}]}]}`, "messages[0].content[0].input", "must be an object"},
		{"tool_result without id", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages[0].content[0].tool_use_id", "field required"},
		{"tool_result content object", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":{}}]}]}`, "messages[0].content[0].content", "must be a string or an array"},
		{"nested block error", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":[{"type":"text"}]}]}]}`, "messages[0].content[0].content[0].text", "field required"},
		{"is_error string", `{` + ok + `,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","is_error":"yes"}]}]}`, "messages[0].content[0].is_error", "must be a boolean"},
		{"thinking without text", `{` + ok + `,"messages":[{"role":"assistant","content":[{"type":"thinking","signature":"s"}]}]}`, "messages[0].content[0].thinking", "field required"},
		{"stream string", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"stream":"true"}`, "stream", "must be a boolean"},
		{"system number", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"system":5}`, "system", "must be a string or an array"},
		{"system block type", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"system":[{"type":"image"}]}`, "system[0].type", "allowed: text"},
		{"tools object", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tools":{}}`, "tools", "must be an array"},
		{"tool without name", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tools":[{"input_schema":{}}]}`, "tools[0].name", "field required"},
		{"custom tool without schema", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a","input_schema":{}},{"name":"b"}]}`, "tools[1].input_schema", "field required"},
		{"schema not object", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a","input_schema":"x"}]}`, "tools[0].input_schema", "must be an object"},
		{"defer_loading string", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a","input_schema":{},"defer_loading":"yes"}]}`, "tools[0].defer_loading", "must be a boolean"},
		{"tool_choice type", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"sometimes"}}`, "tool_choice.type", "allowed: auto, any, tool, none"},
		{"tool_choice tool without name", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"tool"}}`, "tool_choice.name", "field required"},
		{"user_id number", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":1}}`, "metadata.user_id", "must be a string"},
		{"thinking budget string", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":"x"}}`, "thinking.budget_tokens", "must be an integer"},
		{"thinking enabled without budget", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled"}}`, "thinking.budget_tokens", "field required"},
		{"effort number", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":3}}`, "output_config.effort", "must be a string"},
		{"temperature string", `{` + ok + `,"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}`, "temperature", "must be a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRequest([]byte(tt.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want *RequestError", err)
			}
			if re.Field != tt.field || !strings.Contains(re.Message, tt.msg) {
				t.Errorf("got field %q message %q; want field %q message containing %q", re.Field, re.Message, tt.field, tt.msg)
			}
		})
	}
}

func TestDecodeRequestAccepts(t *testing.T) {
	r, err := DecodeRequest([]byte(`{"model":"claude-sonnet-4-5","max_tokens":32000,"messages":[{"role":"user","content":"hi"}],"stream":false,"unknown_field":{"x":1},"tools":[{"type":"web_search_20250305","name":"web_search"}],"temperature":0.5,"top_k":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model() != "claude-sonnet-4-5" || r.Stream() || r.MaxTokens() != 32000 {
		t.Errorf("decoded %q stream=%v max=%d", r.Model(), r.Stream(), r.MaxTokens())
	}
	// 2.1.197's non-streaming retry has no stream field at all.
	r, err = DecodeRequest([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil || r.Stream() {
		t.Errorf("no stream field: %v %v", r, err)
	}
}

func TestRequestErrorMessageBoundsClientValues(t *testing.T) {
	long := strings.Repeat("é", 200)
	_, err := DecodeRequest([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"` + long + `","content":"x"}]}`))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("error not bounded: %d bytes", len(err.Error()))
	}
}
